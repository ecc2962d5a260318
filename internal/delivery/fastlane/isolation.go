package fastlane

import (
	"context"
	"slices"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery"
)

// isolation is why a subscription is isolated on a partition, and whether
// its requests in flight there are cut (a slow endpoint) or may finish (a
// subscription holding the offset, whose requests are not slow).
type isolation struct {
	why string
	cut bool
}

// cutRequest cuts s's request in flight (its subscription was isolated for
// a slow endpoint): the worker is free at once instead of waiting out the
// endpoint's answer, and the head goes to the slow lane first, the rest of
// the stream behind it (cutDone), so order per stream holds. The slow lane
// sends the head again with the same webhook-id: an endpoint that received
// the cut request sees it twice (at least once). Should the answer beat the
// cut (a 2xx), the head settles and the rest is handed over after it
// (parkAfterHead). l.mu held.
func (l *Lane) cutRequest(s *stream) {
	s.parkAfterHead = true
	s.cut = true
	if s.cancel != nil {
		s.cancel()
	}
}

// cutDone applies the outcome of a request cut by an isolation, reporting
// whether it did: the request ended without an answer, so nothing is
// charged or logged (as at shutdown), and the stream is parked with the
// head as its first row — the delivery is handed over, not settled by the
// cut. An answer that beat the cut, a revoke or shutdown under way, or a
// deleted subscription are left to done. l.mu held.
func (l *Lane) cutDone(s *stream, it *item, rt *route, res delivery.AttemptResult) bool {
	if !s.cut {
		return false
	}
	s.cut = false
	if !res.Interrupted {
		return false
	}
	if rt == nil || l.stopping || it.rec.part.revoked || len(s.fast) == 0 || s.fast[0] != it {
		// Nothing settles (done): the partition's next owner, or this
		// member after a restart, sends it again; the stream is not parked
		// by this member any more.
		s.parkAfterHead = false
		return false
	}
	l.stats.cut.Add(1)
	s.parkAfterHead = false
	l.parkHeld(s)
	return true
}

// slowerFactor: a subscription is slower than the others when its requests
// take this many times theirs.
const slowerFactor = 10

// minRequestsToJudge: a subscription's average counts as a yardstick once
// it has timed this many requests.
const minRequestsToJudge = 5

// movingAverage moves avg towards d by 1/weight.
func movingAverage(avg, d time.Duration, weight int64) time.Duration {
	if avg == 0 {
		return d
	}
	return avg + (d-avg)/time.Duration(weight)
}

// slowerThanOthers reports whether d is slowerFactor times the median of
// the other subscriptions' average requests. Isolation compares a
// subscription with the others, so that an endpoint slow for everyone, or
// a machine slow for every request, isolates no one. l.mu held.
func (l *Lane) slowerThanOthers(sub string, d time.Duration) bool {
	var others []time.Duration
	for id, st := range l.subs {
		if id != sub && st.n >= minRequestsToJudge {
			others = append(others, st.took)
		}
	}
	if len(others) == 0 {
		return false
	}
	slices.Sort(others)
	return d >= slowerFactor*others[len(others)/2]
}

// isolateSlow looks at the requests in flight: a subscription whose request
// for a record has been in flight for IsolateAfter, and slowerFactor times
// the other subscriptions' average request (a slow endpoint, not a slow
// machine), is handed to the slow lane as a whole on every partition this
// member owns for IsolationPeriod, its requests in flight cut, so it stops
// holding the partitions' offsets and memory and the member's workers for
// the other subscriptions. Slow is a request in flight that long — not a
// delivery waiting for a worker, which is this member's capacity and the
// same for every subscription. It looks only at the streams sending (at
// most Workers), never at every record held.
func (l *Lane) isolateSlow(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	type partSub struct {
		p   *partition
		sub string
	}
	var slow map[partSub]isolation
	for s := range l.sending {
		if len(s.fast) == 0 || now.Sub(s.sentAt) < l.cfg.IsolateAfter || !l.slowerThanOthers(s.key.sub, now.Sub(s.sentAt)) {
			continue
		}
		p := s.fast[0].rec.part
		if p.revoked || !p.isolated[s.key.sub].Before(now) {
			continue
		}
		if slow == nil {
			slow = map[partSub]isolation{}
		}
		// The endpoint is slow, not the partition: the subscription is
		// isolated on every partition this member owns, at once, rather
		// than one partition each time a request of it there has run
		// IsolateAfter (its next requests, on the next partition, held
		// workers as long again).
		for _, q := range l.parts {
			if !q.revoked && q.isolated[s.key.sub].Before(now) {
				slow[partSub{q, s.key.sub}] = isolation{cut: true,
					why: "a request in flight longer than IsolateAfter and slowerFactor × the other subscriptions' average"}
			}
		}
	}
	// A subscription that holds a partition's offset: the oldest record
	// not yet settled has waited HoldLimit, another subscription has
	// settled it, and this one's delivery of it still waits in the fast
	// lane while the subscription is at its in-flight cap with streams
	// waiting for a slot (its backlog grows faster than its endpoint
	// answers). The others' offset and memory would wait for it: it is
	// isolated too. A subscription under its cap that is merely behind
	// is this member's capacity (workers, CPU), the same for every
	// subscription, and is never isolated: moving it to PostgreSQL would
	// only make the member slower.
	for _, p := range l.parts {
		if p.revoked {
			continue
		}
		head := l.oldestUnsettled(p)
		if head == nil || now.Sub(head.polled) < l.cfg.HoldLimit {
			continue
		}
		var holders []string
		for _, it := range head.items {
			if it.settled || !p.isolated[it.sub].Before(now) {
				continue
			}
			sub := l.subs[it.sub]
			if sub == nil || sub.inFlight < l.capOf(it.sub) || len(sub.waiting) == 0 {
				continue
			}
			// Slower than the others — or left no slot at all here: every
			// one of its cap's slots is kept for its streams parked in the
			// slow lane (capOf), so nothing of it moves in the fast lane
			// until those empty, however fast its endpoint answers (a
			// flaky endpoint with a stream parked per slot; a partition
			// assigned after its isolation elsewhere). Without this its
			// deliveries waited for WEBHOOK_FAST_LANE_MAX_WAITING_AGE.
			if l.capOf(it.sub) > 0 && !l.slowerThanOthers(it.sub, sub.took) {
				continue
			}
			if s := l.streams[streamKey{it.sub, assetKey(&it.rec.msg)}]; s != nil && !s.parked && slices.Contains(s.fast, it) {
				holders = append(holders, it.sub)
			}
		}
		if len(holders) == 0 || head.pending == len(head.items) {
			continue
		}
		for _, sub := range holders {
			if slow == nil {
				slow = map[partSub]isolation{}
			}
			if _, ok := slow[partSub{p, sub}]; !ok {
				slow[partSub{p, sub}] = isolation{why: "at its in-flight cap with streams waiting, holding the partition's oldest record past HoldLimit"}
			}
		}
	}
	// A subscription whose backlog on a partition passes a bound (count,
	// bytes or age) while its backlog is its own and another subscription
	// keeps up there (see overBounds).
	l.overBounds(now, func(p *partition, sub string, why string) {
		if slow == nil {
			slow = map[partSub]isolation{}
		}
		if _, ok := slow[partSub{p, sub}]; !ok {
			slow[partSub{p, sub}] = isolation{why: "backlog past a bound: " + why}
		}
	})
	for ps, iso := range slow {
		if iso.cut {
			// Its endpoint is slow: the slow lane has it at its cap for
			// seconds a request (see deferHandOver).
			l.paceHandOvers(ps.sub, now.Add(l.cfg.IsolationPeriod))
		}
		l.isolate(ctx, ps.p, ps.sub, now, iso)
	}
	return nil
}

// oldestUnsettled is p's first record with a delivery not yet settled
// (nil: none). l.mu held.
func (l *Lane) oldestUnsettled(p *partition) *record {
	for _, r := range p.recs {
		if r.pending > 0 {
			return r
		}
	}
	return nil
}

// isolate hands sub's streams on p to the slow lane: at once for those with
// nothing in flight; for the others, with iso.cut (a slow endpoint) their
// requests in flight are cut and the heads handed over first (cutRequest),
// so no worker waits for an isolated endpoint, and without it (a
// subscription holding the offset, whose requests are not slow) after the
// head. l.mu held.
func (l *Lane) isolate(ctx context.Context, p *partition, sub string, now time.Time, iso isolation) {
	p.isolated[sub] = now.Add(l.cfg.IsolationPeriod)
	streams := 0
	for key, s := range l.streams {
		if key.sub != sub || s.parked || !slices.ContainsFunc(s.fast, func(it *item) bool { return it.rec.part == p }) {
			continue
		}
		streams++
		switch {
		case s.sending && iso.cut:
			l.cutRequest(s)
		case s.sending:
			s.parkAfterHead = true
		default:
			l.parkRest(s)
		}
	}
	l.stats.isolations.Add(1)
	l.log.WarnContext(ctx, "subscription isolated: it held records of its partition unsettled too long; its deliveries there go through the slow lane for a while",
		"subscription_id", sub, "topic", p.tp.topic, "partition", p.tp.partition, "streams", streams, "why", iso.why,
		"for", l.cfg.IsolationPeriod)
}

// failingAfter: a subscription whose heads failed on this many different
// streams in a row (no 2xx in between), within failingWindow, fails at its
// endpoint, not per stream (see headFailed); fewer if its share of the cap
// is smaller.
const failingAfter = 10

// failingWindow: a run of failed heads that has not reached failingAfter
// streams this long after its first failure starts again.
const failingWindow = 10 * time.Second

// failRun is a subscription's failed heads since its last 2xx.
type failRun struct {
	since   time.Time
	streams map[string]struct{}
}

// headFailed counts s's failed head (s is parked by it). Once failingAfter
// different streams of the subscription have failed in a row, its
// endpoint fails, not a stream: the subscription is isolated on every
// partition this member owns, at once, as a slow endpoint is (its streams
// with nothing in flight park without an attempt, the others after their
// head; its new streams start parked for IsolationPeriod). Without it every
// stream of the subscription spent a failing request here first — and with
// its parked streams taking its share of the cap (capOf), the streams not
// failed yet waited in memory for a slot, holding the partitions' offsets,
// until HoldLimit isolated it anyway, one partition at a time, in the
// middle of whatever the others were doing. The slow lane then probes the
// endpoint (delivery's breaker) instead of sending every head. l.mu held.
func (l *Lane) headFailed(s *stream, now time.Time) {
	if l.failing == nil {
		l.failing = map[string]*failRun{}
	}
	sub := s.key.sub
	r := l.failing[sub]
	if r == nil {
		r = &failRun{}
		l.failing[sub] = r
	}
	if r.streams == nil || now.Sub(r.since) > failingWindow {
		r.since, r.streams = now, map[string]struct{}{}
	}
	r.streams[s.key.asset] = struct{}{}
	// A subscription with fewer slots than failingAfter cannot fail on
	// more streams than its slots before its parks take them all (capOf):
	// every slot failing on a different stream is the endpoint.
	if len(r.streams) < min(failingAfter, l.subCap()) {
		return
	}
	r.streams = nil
	l.paceHandOvers(sub, now.Add(l.cfg.IsolationPeriod))
	for _, p := range l.parts {
		if !p.revoked && p.isolated[sub].Before(now) {
			l.isolate(context.Background(), p, sub, now, isolation{why: "its heads failed on different streams in a row: the endpoint fails"})
		}
	}
}

// headSucceeded ends sub's run of failed heads. l.mu held.
func (l *Lane) headSucceeded(sub string) {
	if len(l.failing) > 0 {
		delete(l.failing, sub)
	}
}
