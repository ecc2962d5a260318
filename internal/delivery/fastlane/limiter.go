package fastlane

import (
	"math"
	"slices"
	"time"
)

// The member's live limit on requests in flight (Config.InFlightLimit).
//
// Workers is the most requests a member has in flight; adaptive, the
// member sends at most its live limit of them, which it lowers when its
// requests take longer than they do unloaded and raises when they do not.
// Each member measures its own requests, so members sharing a machine
// (or an egress, or a receiver) settle on what they can push together,
// and a member alone on a machine keeps what it can use; Workers keeps
// its meaning of a ceiling per member.
//
// What it measures: each successful request's duration divided by its own
// subscription's unloaded duration (the lowest moving average of that
// subscription's successful requests over the last one to two baseline
// periods), and per window the median of those ratios. An endpoint that is
// slow by nature is compared with itself (ratio about 1), so a fleet of
// slow endpoints does not shrink the limit; one endpoint that turns slow is
// one subscription among the window's requests, outvoted in the median by
// the others; a failure, a cut request or a timeout is not a sample at all.
// A request in flight longer than a tenth of a second and ten times the
// window's median request stops counting against the limit (it waits on an
// endpoint, not on this member's CPU), so a slow endpoint's requests do not
// take the live limit's slots from the healthy subscriptions while
// isolation decides about them; Workers still bounds them.
//
// The rule per window (a gradient in the manner of Netflix's
// concurrency-limits): with r the median ratio, g = clamp(tolerance ÷ r,
// ½, 1); g = 1 (requests within tolerance of unloaded) adds √limit when
// the window used at least half the limit; g < 1 moves the limit a fifth
// of the way to limit × g + √limit. The limit stays within [limitFloor,
// Workers].

const (
	// limitWindow: a window closes after this long once it holds
	// limitMinSamples successes (or at limitMaxSamples).
	limitWindow     = 50 * time.Millisecond
	limitMinSamples = 16
	limitMaxSamples = 1024
	// limitTolerance: the median request may take this many times its
	// subscription's unloaded duration before the limit shrinks.
	limitTolerance = 2.0
	// limitSmoothing: the share of the way to the new limit a shrinking
	// window moves.
	limitSmoothing = 0.2
	// limitInitial and limitFloor: the live limit at start and at least
	// (both at most Workers). Starting at the floor, the first windows
	// measure the subscriptions' unloaded durations at few requests in
	// flight: measured first at a limit above what the endpoints (or the
	// machine) serve at once, the queueing would count as unloaded.
	limitInitial = 8
	limitFloor   = 8
	// baselinePeriod: a subscription's unloaded duration is the lowest of
	// its moving average over the current and the previous period, so it
	// follows an endpoint that became slower for good within two periods.
	baselinePeriod = 10 * time.Second
	// overdueMin, overdueFactor: a request in flight longer than both
	// overdueMin and overdueFactor × the last window's median request is
	// not counted against the live limit any more.
	overdueMin    = 100 * time.Millisecond
	overdueFactor = 10
)

// InFlightLimit modes (Config.InFlightLimit, WEBHOOK_FAST_LANE_IN_FLIGHT_LIMIT).
const (
	LimitAdaptive = "adaptive"
	LimitFixed    = "fixed"
)

type limiter struct {
	adaptive bool
	ceiling  int
	floor    int
	est      float64
	limit    int
	// The window: ratios and raw durations of its successes, when it
	// started, and the most requests counted at once during it.
	ratios   []float64
	raws     []time.Duration
	winStart time.Time
	winPeak  int
	// median is the last window's median request (what overdue compares
	// with; 0 before the first window).
	median time.Duration
	// base: per subscription, its moving average and its lowest in the
	// current and the previous period.
	base        map[string]*subBase
	periodStart time.Time
	lowest      int
	highest     int
}

type subBase struct {
	avg, cur, prev time.Duration
}

func newLimiter(cfg Config, now time.Time) *limiter {
	lim := &limiter{adaptive: cfg.InFlightLimit != LimitFixed, ceiling: cfg.Workers, floor: min(cfg.Workers, limitFloor),
		base: map[string]*subBase{}, winStart: now, periodStart: now}
	lim.limit = cfg.Workers
	if lim.adaptive {
		lim.limit = min(cfg.Workers, limitInitial)
	}
	lim.est = float64(lim.limit)
	lim.lowest, lim.highest = lim.limit, lim.limit
	return lim
}

// sample records a successful request of sub that took d, and closes the
// window when it is due. It reports whether the limit grew. l.mu held.
func (lim *limiter) sample(sub string, d time.Duration, inFlight int, now time.Time) bool {
	if !lim.adaptive || d <= 0 {
		return false
	}
	b := lim.base[sub]
	if b == nil {
		b = &subBase{avg: d}
		lim.base[sub] = b
	}
	b.avg += (d - b.avg) / 8
	if b.cur == 0 || b.avg < b.cur {
		b.cur = b.avg
	}
	base := b.cur
	if b.prev > 0 && b.prev < base {
		base = b.prev
	}
	lim.ratios = append(lim.ratios, float64(d)/float64(base))
	lim.raws = append(lim.raws, d)
	lim.winPeak = max(lim.winPeak, inFlight)
	if len(lim.ratios) >= limitMaxSamples || (len(lim.ratios) >= limitMinSamples && now.Sub(lim.winStart) >= limitWindow) {
		return lim.update(now)
	}
	return false
}

// update closes the window and sets the limit from it. It reports whether
// the limit grew. l.mu held.
func (lim *limiter) update(now time.Time) bool {
	slices.Sort(lim.ratios)
	slices.Sort(lim.raws)
	r := lim.ratios[len(lim.ratios)/2]
	lim.median = lim.raws[len(lim.raws)/2]
	g := min(1, max(0.5, limitTolerance/r))
	old := lim.limit
	q := math.Sqrt(lim.est)
	if g >= 1 {
		// Within tolerance: grow, unless the window did not use the limit
		// (then its latency says nothing about a higher one).
		if 2*lim.winPeak >= lim.limit {
			lim.est += q
		}
	} else {
		lim.est = lim.est*(1-limitSmoothing) + (lim.est*g+q)*limitSmoothing
	}
	lim.est = min(float64(lim.ceiling), max(float64(lim.floor), lim.est))
	lim.limit = int(lim.est)
	lim.lowest, lim.highest = min(lim.lowest, lim.limit), max(lim.highest, lim.limit)
	lim.ratios, lim.raws = lim.ratios[:0], lim.raws[:0]
	lim.winStart, lim.winPeak = now, 0
	if now.Sub(lim.periodStart) >= baselinePeriod {
		lim.periodStart = now
		for id, b := range lim.base {
			if b.cur == 0 && b.prev == 0 {
				delete(lim.base, id) // no success in two periods
				continue
			}
			b.prev, b.cur = b.cur, 0
		}
	}
	return lim.limit > old
}

// overdueAfter is how long a request may be in flight before it stops
// counting against the live limit (0: never, the limit is fixed).
func (lim *limiter) overdueAfter() time.Duration {
	if !lim.adaptive {
		return 0
	}
	return max(overdueMin, overdueFactor*lim.median)
}

// tickLimit uncounts the requests in flight past overdueAfter and wakes
// the workers they make room for; their subscriptions' next requests may
// start uncounted (see sendsUncounted). Run every limitWindow/2 with the
// isolation-style services.
func (l *Lane) tickLimit() {
	l.mu.Lock()
	defer l.mu.Unlock()
	after := l.lim.overdueAfter()
	if after == 0 {
		return
	}
	now := time.Now()
	for s := range l.sending {
		if s.late || now.Sub(s.sentAt) <= after {
			continue
		}
		l.wentLate(s)
		if !s.overdue {
			s.overdue = true
			l.active--
			l.work.Signal()
		}
	}
}

// sampleLimit feeds a successful request of sub that took d to the live
// limit and wakes the workers a higher limit lets send. l.mu held.
func (l *Lane) sampleLimit(sub string, d time.Duration) {
	if !l.lim.adaptive {
		return
	}
	grew := l.lim.sample(sub, d, l.active+1, time.Now())
	l.stats.limit.Store(int64(l.lim.limit))
	l.stats.limitLowest.Store(int64(l.lim.lowest))
	l.stats.limitHighest.Store(int64(l.lim.highest))
	if grew {
		l.work.Broadcast()
	}
}
