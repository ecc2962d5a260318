package fastlane

import (
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/webhooktest"
)

// A subscription whose endpoint holds every request: once its requests
// have gone past overdueAfter without a quick answer, its next ones start
// outside the live limit. Counted, each of them took one of the limit's
// places until tickLimit let it go a tenth of a second later, so with its
// streams coming up in the ready queue among the others' it went out in
// waves of about the live limit a tick apart, and between the waves its
// requests held every place: the healthy subscriptions sent in bursts
// until it reached its per-subscription cap. Its 64 requests (the cap)
// arrive in at most two waves: the first, counted, and the rest once the
// first went late. Isolation is off: what is tested is the limit.
func TestFastLaneSlowEndpointsNextRequestsStartUncounted(t *testing.T) {
	w := newWorld(t, 4, 4)
	slowPath := w.paths[0]
	const slowCap = 64
	var mu sync.Mutex
	var arrivals []time.Time // the slow endpoint's requests
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if r.Subscription == slowPath {
			mu.Lock()
			arrivals = append(arrivals, r.Received)
			mu.Unlock()
			return http.StatusNoContent, 10 * time.Second
		}
		return http.StatusNoContent, 0
	}
	l, _ := w.lane(t, func(c *Config) {
		c.Workers = 128
		c.MaxInFlightPerSubscription = slowCap
		c.IsolateAfter, c.HoldLimit, c.MaxWaitingAge = time.Hour, time.Hour, time.Hour
	})
	as := assets(200)
	w.produce(t, as, 3)
	var waves int
	testkit.Eventually(t, 60*time.Second, func() string {
		mu.Lock()
		defer mu.Unlock()
		return testkit.Unless(len(arrivals) >= slowCap, "the slow endpoint has %d of its %d requests", len(arrivals), slowCap)
	})
	mu.Lock()
	at := slices.Clone(arrivals[:slowCap])
	mu.Unlock()
	slices.SortFunc(at, time.Time.Compare)
	waves = 1
	for i := 1; i < len(at); i++ {
		if at[i].Sub(at[i-1]) >= overdueMin/2 {
			waves++
		}
	}
	t.Logf("live limit %+v; the slow endpoint's %d requests came in %d waves over %s", l.Stats(), slowCap, waves, at[len(at)-1].Sub(at[0]))
	if waves > 2 {
		t.Fatalf("the slow endpoint's %d requests came in %d waves a tick apart: each wave held the live limit's places", slowCap, waves)
	}
	w.checkClean(t)
}

// A subscription isolated for a slow endpoint has its live deliveries
// appended behind its parked streams at most once a second, as a failing
// one does: ten produces 100 ms apart make at most three hand-over
// transactions (rows of one transaction share its xmin), not one per
// HandOverInterval. Once the endpoint answers again the slow lane delivers
// every event, in order.
func TestFastLaneAppendsASlowEndpointsDeliveriesOnceASecond(t *testing.T) {
	w := newWorld(t, 4, 2)
	slowPath := w.paths[1]
	var slowOn atomic.Bool
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if r.Subscription == slowPath && slowOn.Load() {
			return http.StatusNoContent, 10 * time.Second
		}
		return http.StatusNoContent, 0
	}
	l, _ := w.lane(t, func(c *Config) {
		c.MaxInFlightPerSubscription = 8
		c.IsolateAfter = 300 * time.Millisecond
	})
	as := assets(20)
	// Every subscription answers fast first: isolation has the others'
	// averages to compare with.
	w.produce(t, as, 2)
	w.waitAccepted(t, len(w.subs)*len(as)*2, 60*time.Second)

	slowOn.Store(true)
	w.produce(t, as, 2)
	want := int64(len(as) * 2)
	testkit.Eventually(t, 30*time.Second, func() string {
		st := l.Stats()
		return testkit.Unless(st.HandedOver == want && st.Cut > 0, "handed over %d of the slow subscription's %d, %d requests cut",
			st.HandedOver, want, st.Cut)
	})
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
		return testkit.Unless(st.HandedOver == want, "handed over %d of the slow subscription's %d", st.HandedOver, want)
	})
	if n := w.count(t, `SELECT count(DISTINCT xmin::text)::int FROM bridge.deliveries WHERE subscription_id = $1 AND asset_seq > 4`,
		w.subs[1].ID); n > 3 {
		t.Errorf("the live deliveries of a slow endpoint took %d hand-overs over a second, want at most 3", n)
	}
	slowOn.Store(false)
	w.slowLane(t, nil)
	w.waitAccepted(t, len(w.subs)*len(as)*4+len(live)*10*len(w.subs), 90*time.Second)
	w.checkClean(t)
}
