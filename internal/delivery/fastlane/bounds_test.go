package fastlane

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/logging"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/webhooktest"
)

// backlogWorld: three subscriptions on two partitions; the first answers in
// 200 ms while slowOn is set, the others at once. One hot asset gets 300
// events: the first subscription's stream of it, one request at a time,
// needs a minute for them, while the others' take well under a second — a
// backlog of its own (under its in-flight cap, no request slow enough to
// isolate it, nothing waiting for a worker) that holds its partition's
// offset. Ten more assets get 5 events each.
func backlogWorld(t *testing.T) (w *world, slowOn *atomic.Bool) {
	w = newWorld(t, 2, 3)
	slowOn = &atomic.Bool{}
	slowOn.Store(true)
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if r.Subscription == w.paths[0] && slowOn.Load() {
			return http.StatusNoContent, 200 * time.Millisecond
		}
		return http.StatusNoContent, 0
	}
	return w, slowOn
}

// checkBoundIsolates runs backlogWorld's load with the bounds set by bound
// and checks that the backlog's subscription, and only it, is isolated:
// the offsets reach the end of the topic while its endpoint is still slow,
// the other subscriptions get everything from the fast lane, and once the
// endpoint recovers every event arrives, in order per (subscription,
// asset), one request in flight per stream.
func checkBoundIsolates(t *testing.T, bound func(*Config)) {
	w, slowOn := backlogWorld(t)
	l, _ := w.lane(t, func(c *Config) {
		c.MaxWaiting, c.MaxWaitingBytes, c.MaxWaitingAge = 1_000_000, 1<<40, time.Hour
		bound(c)
	})
	w.slowLane(t, nil)
	as := assets(10)
	w.produce(t, []string{"hot"}, 300)
	w.produce(t, as, 5)
	others := 2 * (300 + len(as)*5)
	testkit.Eventually(t, 30*time.Second, func() string {
		c, end := w.committed(t)
		st := w.recv.Stats()
		return testkit.Unless(c == end && st.Accepted >= others,
			"committed %d of end %d, accepted %d (the other subscriptions' %d): the backlog holds the offset", c, end, st.Accepted, others)
	})
	st := l.Stats()
	if st.Isolations < 1 || st.HandedOver == 0 {
		t.Errorf("stats %+v: want the backlog's subscription isolated and handed over", st)
	}
	if n := w.count(t, `SELECT count(*)::int FROM bridge.deliveries WHERE subscription_id <> $1`, w.subs[0].ID); n != 0 {
		t.Errorf("%d deliveries of the subscriptions that keep up went to the slow lane, want 0", n)
	}
	if n := w.count(t, `SELECT count(*)::int FROM bridge.deliveries WHERE subscription_id = $1`, w.subs[0].ID); n == 0 {
		t.Errorf("no delivery of the backlog's subscription went to the slow lane")
	}
	slowOn.Store(false)
	w.waitAccepted(t, len(w.subs)*(300+len(as)*5), 90*time.Second)
	w.checkClean(t)
}

// Each bound alone isolates the subscription past it; none of the
// existing rules would (its requests take 200 ms, far under IsolateAfter;
// it is far under its in-flight cap), so without the bounds the offsets
// wait a minute for the hot stream.
func TestFastLaneIsolatesASubscriptionPastItsBacklogCount(t *testing.T) {
	checkBoundIsolates(t, func(c *Config) { c.MaxWaiting = 50 })
}

func TestFastLaneIsolatesASubscriptionPastItsBacklogBytes(t *testing.T) {
	// A record counts its value and key plus 200 bytes: 50 of them pass 15
	// kB.
	checkBoundIsolates(t, func(c *Config) { c.MaxWaitingBytes = 15_000 })
}

func TestFastLaneIsolatesASubscriptionPastItsBacklogAge(t *testing.T) {
	checkBoundIsolates(t, func(c *Config) { c.MaxWaitingAge = 2 * time.Second })
}

// A backlog every subscription shares is the member's capacity, not one
// subscription holding the others: with every endpoint as slow, bounds
// passed by all isolate no one (moving the backlog to PostgreSQL would
// only make the member slower).
func TestFastLaneBoundsIsolateNoOneWhenEveryoneIsBehind(t *testing.T) {
	w := newWorld(t, 2, 3)
	w.recv.Respond = func(*webhooktest.Request) (int, time.Duration) { return http.StatusNoContent, 20 * time.Millisecond }
	l, _ := w.lane(t, func(c *Config) { c.MaxWaiting, c.MaxWaitingAge = 20, time.Second })
	w.produce(t, []string{"hot"}, 150)
	w.waitAccepted(t, len(w.subs)*150, 60*time.Second)
	w.checkClean(t)
	if st := l.Stats(); st.HandedOver != 0 || st.Isolations != 0 {
		t.Errorf("stats %+v: want no isolation when every subscription is as far behind", st)
	}
}

// A subscription with streams in both lanes — heads that fail once park
// their streams, the slow lane retries them while the fast lane sends the
// others — never has more requests in flight than its cap, both lanes
// together (each lane with the whole cap let it have up to twice as many).
// A refusal is answered at once and a success takes 300 ms: the slot a
// failed head gives back goes to another stream at once, and the parked
// head is due in the slow lane 50 ms after its hand-over, while that
// stream's request still runs (written at once, the hand-over let the
// subscription have one request over its cap).
func TestFastLaneCapHoldsAcrossBothLanes(t *testing.T) {
	w := newWorld(t, 2, 2)
	const limit = 4
	var mu sync.Mutex
	inFlight, peak := map[string]int{}, map[string]int{}
	var refused atomic.Int64
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		mu.Lock()
		inFlight[r.Subscription]++
		peak[r.Subscription] = max(peak[r.Subscription], inFlight[r.Subscription])
		mu.Unlock()
		// A quarter of the assets refuse each event's first attempt: their
		// streams keep parking, and come back once the slow lane has
		// emptied them.
		if a := r.Envelope.AssetID; a != nil && (*a)[len(*a)-1]%4 == 0 && r.Attempt == 1 {
			refused.Add(1)
			return http.StatusInternalServerError, 0
		}
		return http.StatusNoContent, 300 * time.Millisecond
	}
	w.recv.Observe = func(r *webhooktest.Request) {
		mu.Lock()
		inFlight[r.Subscription]--
		mu.Unlock()
	}
	w.recv.Gapless = true
	l, _ := w.lane(t, func(c *Config) { c.MaxInFlightPerSubscription = limit })
	// The slow lane's claims take the same cap.
	d, err := delivery.NewDeliverer(w.db.Pool, delivery.Config{
		AllowedCIDRs: loopback, PollInterval: 50 * time.Millisecond, MaxInFlightPerSubscription: limit,
		RetrySchedule: []time.Duration{50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond},
		Logger:        logging.New(t.Output(), "info", "text"),
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, d.Run)
	as := assets(40)
	w.produce(t, as, 4)
	w.waitAccepted(t, len(w.subs)*len(as)*4, 120*time.Second)
	w.checkClean(t)
	st := l.Stats()
	if st.HandedOver == 0 || refused.Load() == 0 || st.Delivered == 0 {
		t.Fatalf("stats %+v, %d refused: want streams in both lanes", st, refused.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	for _, path := range w.paths {
		if peak[path] > limit {
			t.Errorf("subscription %s: %d requests in flight at once, cap %d", path, peak[path], limit)
		}
		if peak[path] < limit/2 {
			t.Errorf("subscription %s: at most %d requests at once: the test did not load the cap", path, peak[path])
		}
	}
}

// The backlogs let go of what settled: once everything is delivered, every
// (subscription, partition) backlog counts nothing and holds no delivery,
// also on a partition only one subscription gets deliveries from (no
// bound is ever judged there, and the settled deliveries' records would be
// kept alive by the backlog's queue).
func TestFastLaneBacklogsLetGoOfSettledDeliveries(t *testing.T) {
	w := newWorld(t, 1, 1)
	l, _ := w.lane(t, nil)
	w.produce(t, assets(5), 20)
	w.waitAccepted(t, 5*20, 60*time.Second)
	w.checkClean(t)
	testkit.Eventually(t, 10*time.Second, func() string {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, p := range l.parts {
			for sub, b := range p.waiting {
				if b.count != 0 || b.bytes != 0 || len(b.queue) != 0 {
					return fmt.Sprintf("partition %d, subscription %s: backlog of %d deliveries, %d bytes, %d queued",
						p.tp.partition, sub, b.count, b.bytes, len(b.queue))
				}
			}
		}
		return ""
	})
}
