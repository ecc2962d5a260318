package fastlane

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/webhooktest"
)

// A subscription whose endpoint turns slow, with the member's workers no
// more than its in-flight cap: without the cut, its requests in flight
// would hold every worker until they are answered, and the others would
// wait. Isolated, its requests in flight are cut at once, so the others
// finish while none of its slow requests has been answered; every one of
// its deliveries is handed to the slow lane, and each cut delivery arrives
// later with the same webhook-id, in order.
func TestFastLaneCutsAnIsolatedSubscriptionsRequests(t *testing.T) {
	w := newWorld(t, 4, 3)
	const delay = 10 * time.Second
	slowPath := w.paths[2]
	var slowOn atomic.Bool
	var mu sync.Mutex
	var answered int        // the slow subscription's requests answered after the whole delay
	cut := map[string]int{} // webhook-id of a request cut before its answer → its attempt
	again := map[string]webhooktest.Outcome{}
	slowed := map[string]bool{} // webhook-ids answered with the delay
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if r.Subscription == slowPath && slowOn.Load() {
			mu.Lock()
			slowed[r.WebhookID] = true
			mu.Unlock()
			return http.StatusNoContent, delay
		}
		return http.StatusNoContent, 0
	}
	var healthyAccepted atomic.Int64
	w.recv.Observe = func(r *webhooktest.Request) {
		if r.Subscription != slowPath {
			if r.Outcome == webhooktest.Accepted {
				healthyAccepted.Add(1)
			}
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch took := r.Answered.Sub(r.Received); {
		case took >= delay:
			answered++
		case slowed[r.WebhookID] && cut[r.WebhookID] == 0:
			// The receiver's wait ended with the request: the lane cut it.
			cut[r.WebhookID] = r.Attempt
		}
		if _, ok := cut[r.WebhookID]; ok && r.Attempt > cut[r.WebhookID] {
			again[r.WebhookID] = r.Outcome
		}
	}
	l, _ := w.lane(t, func(c *Config) {
		c.Workers = 2
		c.MaxInFlightPerSubscription = 2
		c.IsolateAfter = 300 * time.Millisecond
	})
	w.slowLane(t, nil)
	as := assets(20)
	// Every subscription answers fast first: isolation has the others'
	// averages to compare with.
	w.produce(t, as, 2)
	w.waitAccepted(t, len(w.subs)*len(as)*2, 60*time.Second)

	slowOn.Store(true)
	w.produce(t, as, 10)
	healthy := int64(2 * len(as) * 12)
	testkit.Eventually(t, 60*time.Second, func() string {
		n := healthyAccepted.Load()
		return testkit.Unless(n >= healthy, "healthy subscriptions accepted %d of %d", n, healthy)
	})
	mu.Lock()
	slowAnswered, cuts := answered, len(cut)
	mu.Unlock()
	if slowAnswered != 0 {
		t.Fatalf("%d of the slow subscription's requests were answered before the others finished: its requests held the workers", slowAnswered)
	}
	st := l.Stats()
	if st.Cut < 1 || int(st.Cut) != cuts {
		t.Errorf("lane cut %d requests, the receiver saw %d cut: want the same, at least 1", st.Cut, cuts)
	}
	testkit.Eventually(t, 10*time.Second, func() string {
		st = l.Stats()
		return testkit.Unless(st.HandedOver == int64(len(as)*10), "handed over %d, want the slow subscription's %d", st.HandedOver, len(as)*10)
	})

	// The endpoint recovers: the slow lane sends everything, the cut
	// deliveries again with their webhook-id, in order.
	slowOn.Store(false)
	w.waitAccepted(t, len(w.subs)*len(as)*12, 90*time.Second)
	w.checkClean(t)
	mu.Lock()
	defer mu.Unlock()
	for id := range cut {
		if again[id] != webhooktest.Duplicate {
			t.Errorf("cut delivery %s: sent again with the same webhook-id as %q, want %q", id, again[id], webhooktest.Duplicate)
		}
	}
}

// Two members of the group own half the partitions each: each takes half
// of MaxInFlightPerSubscription, so the endpoint never has more than the
// cap of one subscription's requests at once (each member with the whole
// cap would let it have twice as many).
func TestFastLaneCapHoldsAcrossMembers(t *testing.T) {
	w := newWorld(t, 4, 1)
	var mu sync.Mutex
	var inFlight, peak int
	w.recv.Respond = func(*webhooktest.Request) (int, time.Duration) {
		mu.Lock()
		inFlight++
		peak = max(peak, inFlight)
		mu.Unlock()
		return http.StatusNoContent, 100 * time.Millisecond
	}
	w.recv.Observe = func(*webhooktest.Request) {
		mu.Lock()
		inFlight--
		mu.Unlock()
	}
	const limit = 4
	cfg := func(c *Config) { c.MaxInFlightPerSubscription = limit }
	a, _ := w.lane(t, cfg)
	testkit.Eventually(t, 30*time.Second, func() string {
		return testkit.Unless(len(a.Gauges().Partitions) == 4, "member A owns %d partitions", len(a.Gauges().Partitions))
	})
	b, _ := w.lane(t, cfg)
	testkit.Eventually(t, 30*time.Second, func() string {
		na, nb := len(a.Gauges().Partitions), len(b.Gauges().Partitions)
		return testkit.Unless(na == 2 && nb == 2, "members own %d and %d partitions, want 2 and 2", na, nb)
	})
	as := assets(40)
	w.produce(t, as, 3)
	w.waitAccepted(t, len(as)*3, 60*time.Second)
	w.checkClean(t)
	mu.Lock()
	defer mu.Unlock()
	if peak > limit {
		t.Errorf("the endpoint had %d of the subscription's requests at once, cap %d", peak, limit)
	}
	if peak < limit/2 {
		t.Errorf("the endpoint had at most %d requests at once: the test did not load the cap", peak)
	}
	if sa, sb := a.Stats(), b.Stats(); sa.Delivered == 0 || sb.Delivered == 0 {
		t.Errorf("delivered %d and %d: want both members delivering", sa.Delivered, sb.Delivered)
	}
}

// An endpoint that answers 500 to everything: once its heads have failed on
// as many different streams as it has slots, the subscription is isolated
// on every partition at once — all of its deliveries are handed over,
// without a failing request per stream and without waiting for HoldLimit
// (its parks took its slots: the streams not failed yet could not get
// one). The other subscription is delivered meanwhile; once the endpoint
// answers again the slow lane delivers every event, in order.
func TestFastLaneIsolatesAnEndpointThatFailsEveryStream(t *testing.T) {
	w := newWorld(t, 4, 2)
	failPath := w.paths[1]
	var failing atomic.Bool
	failing.Store(true)
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if r.Subscription == failPath && failing.Load() {
			return http.StatusInternalServerError, 0
		}
		return http.StatusNoContent, 0
	}
	const slots = 4
	l, _ := w.lane(t, func(c *Config) {
		c.MaxInFlightPerSubscription = slots
		c.HoldLimit = 10 * time.Minute // only the failing endpoint's rule may isolate it
	})
	as := assets(40)
	w.produce(t, as, 3)
	want := int64(len(as) * 3)
	testkit.Eventually(t, 20*time.Second, func() string {
		st := l.Stats()
		return testkit.Unless(st.HandedOver == want, "handed over %d of the failing subscription's %d", st.HandedOver, want)
	})
	st := l.Stats()
	if st.Isolations < 1 {
		t.Errorf("isolations = %d, want the failing subscription isolated", st.Isolations)
	}
	// At most its slots' worth of failed heads, and the ones in flight
	// when it was isolated: not one per stream.
	if st.Failed > 2*slots {
		t.Errorf("%d heads failed in the fast lane, want at most %d (one per stream would be %d)", st.Failed, 2*slots, len(as))
	}
	// Its live deliveries are appended at most once a second (not every
	// HandOverInterval): ten produces 100 ms apart make at most three
	// hand-over transactions (rows of one transaction share its xmin).
	live := as[:5]
	tick := time.NewTicker(100 * time.Millisecond)
	for range 10 {
		<-tick.C // the producer's pace, not a wait for a condition
		w.produce(t, live, 1)
	}
	tick.Stop()
	want += int64(len(live) * 10)
	testkit.Eventually(t, 20*time.Second, func() string {
		st := l.Stats()
		return testkit.Unless(st.HandedOver == want, "handed over %d of the failing subscription's %d", st.HandedOver, want)
	})
	if n := w.count(t, `SELECT count(DISTINCT xmin::text)::int FROM bridge.deliveries WHERE subscription_id = $1 AND asset_seq > 3`,
		w.subs[1].ID); n > 3 {
		t.Errorf("the live deliveries of a failing endpoint took %d hand-overs over a second, want at most 3", n)
	}
	w.slowLane(t, nil)
	failing.Store(false)
	w.waitAccepted(t, len(w.subs)*(len(as)*3+len(live)*10), 90*time.Second)
	w.checkClean(t)
}

// A subscription every slot of whose cap is kept for its streams parked in
// the slow lane (two parked streams, a cap of two) has no slot left in the
// fast lane, however fast its endpoint answers: its deliveries of other
// assets would wait in memory, holding the partition's offset for the
// other subscription, until WEBHOOK_FAST_LANE_MAX_WAITING_AGE (30 s). Past
// HoldLimit it is isolated: its deliveries go to the slow lane (not running
// here, so they stay there as rows) and the offset reaches the end.
func TestFastLaneIsolatesASubscriptionLeftNoSlot(t *testing.T) {
	w := newWorld(t, 1, 2)
	ctx := t.Context()
	// Two streams of the first subscription with a delivery pending in
	// bridge.deliveries: the lane parks them at its start.
	for i, asset := range []string{"parked-0", "parked-1"} {
		if _, err := w.db.Pool.Exec(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at)
VALUES ($1, $2, 'asset.updated', $3, $4, 1, '{}', now())`, w.subs[0].ID, fmt.Sprintf("pending-%d", i), w.topic, asset); err != nil {
			t.Fatal(err)
		}
	}
	w.recv.Gapless = false // the parked streams' pending rows are never sent here
	var second atomic.Int64
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if r.Subscription == w.paths[1] {
			second.Add(1)
		}
		return http.StatusNoContent, 0
	}
	w.lane(t, func(c *Config) {
		c.MaxInFlightPerSubscription = 2
		c.HoldLimit = 300 * time.Millisecond
	})
	as := assets(10)
	w.produce(t, as, 3)
	// The second subscription gets everything from the fast lane.
	testkit.Eventually(t, 30*time.Second, func() string {
		n := second.Load()
		return testkit.Unless(n >= int64(len(as)*3), "second subscription got %d of %d", n, len(as)*3)
	})
	testkit.Eventually(t, 10*time.Second, func() string {
		c, end := w.committed(t)
		return testkit.Unless(c == end, "committed %d of end %d: the first subscription holds the offset", c, end)
	})
	if n := w.count(t, `SELECT count(*)::int FROM bridge.deliveries WHERE subscription_id = $1 AND asset_id LIKE 'asset-%'`, w.subs[0].ID); n != len(as)*3 {
		t.Errorf("%d of the first subscription's deliveries handed to the slow lane, want %d", n, len(as)*3)
	}
	w.checkClean(t)
}
