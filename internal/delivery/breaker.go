package delivery

import (
	"log/slog"
	"sync"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// The slow lane's per-subscription breaker: an endpoint that fails every
// stream gets a probe at a time instead of every due head at once.
//
// The rule. A subscription whose attempts in this deliverer failed on
// BreakerAfter different streams in a row (no 2xx in between, the run
// begun within breakerWindow) and that had no 2xx for ProbeInterval is
// **probing**: a claim takes at most one of
// its due heads, and only when nothing of it is delivering and ProbeInterval
// has passed since its last probe was claimed. Its first 2xx closes the
// breaker and every due head of it is claimable again at once.
//
// The schedule for a stream waiting behind a probe: its head keeps its own
// attempts and next_attempt_at. Waiting is no attempt — nothing is charged,
// logged or rescheduled, as for a subscription at its in-flight cap or out
// of rate tokens — so a head is sent at its next_attempt_at or when the
// breaker next lets it through, whichever is later. A probe is an ordinary
// attempt of the head the claim picks (as any claim does: the lowest seq
// among the due heads it looks at): charged, its failure rescheduled by the
// schedule and its own Retry-After, dead when its schedule is exhausted; a death counts
// towards WEBHOOK_DISABLE_AFTER and a 2xx resets the count, as always. So
// deaths (and a disable) come no sooner than the schedule says, and later
// only by the time a head waits behind probes. One request per stream and
// the order within a stream are the claim's, unchanged.
//
// Why ProbeInterval without a 2xx as well: an endpoint that fails some
// attempts and accepts others (each event's first tries refused, its next
// accepted) fails ten streams in a row whenever a wave of first tries goes
// out together, and a breaker that opened on the count alone held it to one
// probe a second, reopened at every wave after each release, while it was
// accepting deliveries every second: a backlog such an endpoint works
// through in seconds took minutes. An endpoint that accepts nothing is held
// after its first BreakerAfter failing streams, as before.
//
// The failure it prevents: one endpoint answering 500 to everything with
// 1,000 streams parked in the slow lane made 1,000 claims, requests and
// outcome updates at the schedule's 0s and again at 5s, in bursts, on the
// CPU the healthy subscriptions were using (`bench deliver
// --failing-subscriptions 1`: their live p99 1.4–1.9× the clean run's).
//
// The state is this deliverer's, in memory: each replica probes on its own
// (one probe per replica per interval), and a restart starts closed.
type breakers struct {
	after    int
	interval time.Duration
	log      *slog.Logger

	mu   sync.Mutex
	subs map[string]*breaker // every subscription that answered or failed here
	open int                 // how many of subs are open: plan skips the map when none is
}

// breakerWindow: a run of failures that has not reached BreakerAfter
// streams this long after its first failure starts again (failures spread
// over minutes are single streams' trouble, not an endpoint's).
const breakerWindow = 10 * time.Second

type breaker struct {
	since   time.Time           // the run's first failure
	streams map[string]struct{} // the streams that failed in the run (until open)
	open    bool
	probed  time.Time // when its last probe was claimed
	ok      time.Time // its last 2xx in this deliverer (zero: none yet)
}

func newBreakers(after int, interval time.Duration, log *slog.Logger) *breakers {
	return &breakers{after: after, interval: interval, log: log, subs: map[string]*breaker{}}
}

// failed records a failed attempt of c (any answer but a 2xx, or none).
func (b *breakers) failed(c *store.Claim, now time.Time) {
	if b.after <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	br := b.subs[c.SubscriptionID]
	if br == nil {
		br = &breaker{}
		b.subs[c.SubscriptionID] = br
	}
	if br.open {
		return
	}
	if br.streams == nil || now.Sub(br.since) > breakerWindow {
		br.since, br.streams = now, map[string]struct{}{}
	}
	asset := ""
	if c.AssetID != nil {
		asset = *c.AssetID
	}
	br.streams[asset] = struct{}{}
	if len(br.streams) >= b.after && now.Sub(br.ok) >= b.interval {
		br.open, br.streams, br.probed = true, nil, now
		b.open++
		b.log.Warn("subscription's endpoint fails every stream: its due deliveries wait behind one probe at a time until one succeeds",
			"subscription_id", c.SubscriptionID, "streams_failed", b.after, "probe_interval", b.interval)
	}
}

// succeeded closes sub's breaker and ends its run of failures, reporting
// whether the breaker was open (its waiting heads are claimable now: wake
// the claim loops).
func (b *breakers) succeeded(sub string, now time.Time) bool {
	if b.after <= 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	br := b.subs[sub]
	if br == nil {
		b.subs[sub] = &breaker{ok: now}
		return false
	}
	wasOpen := br.open
	*br = breaker{ok: now}
	if wasOpen {
		b.open--
		b.log.Info("subscription's probe succeeded: its deliveries flow again", "subscription_id", sub)
	}
	return wasOpen
}

// plan is what the next claim may take of the open breakers' subscriptions:
// held take nothing, probing at most one head (when nothing of theirs is
// delivering), and wait is how long until the next held one may probe (0:
// none held).
func (b *breakers) plan(now time.Time) (held, probing []string, wait time.Duration) {
	if b.after <= 0 {
		return nil, nil, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open == 0 {
		return nil, nil, 0
	}
	for sub, br := range b.subs {
		if !br.open {
			continue
		}
		if left := b.interval - now.Sub(br.probed); left > 0 {
			held = append(held, sub)
			if wait == 0 || left < wait {
				wait = left
			}
			continue
		}
		probing = append(probing, sub)
	}
	return held, probing, wait
}

// claimed notes the probes among claims.
func (b *breakers) claimed(claims []store.Claim, now time.Time) {
	if b.after <= 0 || len(claims) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range claims {
		if br := b.subs[claims[i].SubscriptionID]; br != nil && br.open {
			br.probed = now
		}
	}
}
