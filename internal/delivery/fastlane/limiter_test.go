package fastlane

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/webhooktest"
)

// gate is an endpoint that serves at most size requests at once, each for
// service, and queues the rest in arrival order of their turn.
type gate struct {
	mu      sync.Mutex
	cond    *sync.Cond
	size    int
	busy    int
	peak    int
	service time.Duration
}

func newGate(size int, service time.Duration) *gate {
	g := &gate{size: size, service: service}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// serve holds one of the gate's places for the service time.
func (g *gate) serve() {
	g.mu.Lock()
	for g.busy >= g.size {
		g.cond.Wait()
	}
	g.busy++
	g.peak = max(g.peak, g.busy)
	g.mu.Unlock()
	time.Sleep(g.service) // the endpoint's work
	g.mu.Lock()
	g.busy--
	g.cond.Signal()
	g.mu.Unlock()
}

// highest is the most requests the gate served at once.
func (g *gate) highest() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.peak
}

func (g *gate) resize(size int) {
	g.mu.Lock()
	g.size = size
	g.cond.Broadcast()
	g.mu.Unlock()
}

// An endpoint that serves 8 requests at once and queues the rest: the
// member's live limit comes down from where a fast endpoint let it grow to
// about twice what the endpoint serves at once (requests beyond that only
// wait in its queue), and goes back up when the endpoint serves many at
// once again. Order and one request in flight per stream hold throughout.
func TestFastLaneLimitFollowsWhatTheEndpointServesAtOnce(t *testing.T) {
	w := newWorld(t, 4, 4)
	const service = 20 * time.Millisecond
	g := newGate(1000, service)
	w.recv.Respond = func(*webhooktest.Request) (int, time.Duration) {
		g.serve()
		return http.StatusNoContent, 0
	}
	l, _ := w.lane(t, func(c *Config) { c.Workers = 128 })
	as := assets(100)
	w.produce(t, as, 40)
	limit := func() int64 { return l.Stats().InFlightLimit }

	testkit.Eventually(t, 60*time.Second, func() string {
		return testkit.Unless(limit() >= 64, "live limit %d with the endpoint serving everything at once", limit())
	})
	g.resize(8)
	testkit.Eventually(t, 60*time.Second, func() string {
		return testkit.Unless(limit() <= 24, "live limit %d with the endpoint serving 8 at once", limit())
	})
	if low := l.Stats().InFlightLimitLowest; low < 8 {
		t.Fatalf("live limit fell to %d, below its floor of 8", low)
	}
	g.resize(1000)
	testkit.Eventually(t, 60*time.Second, func() string {
		return testkit.Unless(limit() >= 64, "live limit %d with the endpoint serving everything at once again", limit())
	})
	t.Logf("live limit %+v, endpoint's peak %d", l.Stats(), g.highest())
	w.waitAccepted(t, len(w.subs)*len(as)*40, 120*time.Second)
	w.checkClean(t)
	if st := l.Stats(); st.InFlightLimitHighest > 128 || st.HandedOver != 0 {
		t.Fatalf("live limit reached %d (Workers 128); %d deliveries handed over", st.InFlightLimitHighest, st.HandedOver)
	}
}

// A slow endpoint (1 s a request, its subscription at its cap of 64 in
// flight, not isolated here) does not starve the healthy subscriptions,
// whose endpoint serves 8 requests at once (so their requests queue there
// and the limit has a reason to come down): the slow requests' durations
// are compared with their own, and the healthy requests' keep the limit
// above what the slow ones hold (they stop counting once overdue too). The
// healthy subscriptions keep at least their endpoint's 8 requests at it
// while the slow one holds 32 or more, and their backlog is delivered.
func TestFastLaneLimitIgnoresASlowEndpoint(t *testing.T) {
	w := newWorld(t, 4, 4)
	slowPath := w.paths[3]
	g := newGate(8, 20*time.Millisecond)
	var slowInFlight, healthyInFlight, slowPeak, healthyPeakBesideSlow atomic.Int64
	peak := func(p *atomic.Int64, n int64) {
		for old := p.Load(); n > old && !p.CompareAndSwap(old, n); old = p.Load() {
		}
	}
	var healthyAccepted atomic.Int64
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if r.Subscription == slowPath {
			peak(&slowPeak, slowInFlight.Add(1))
			return http.StatusNoContent, time.Second
		}
		n := healthyInFlight.Add(1)
		if slowInFlight.Load() >= 32 {
			peak(&healthyPeakBesideSlow, n)
		}
		g.serve()
		return http.StatusNoContent, 0
	}
	w.recv.Observe = func(r *webhooktest.Request) {
		if r.Subscription == slowPath {
			slowInFlight.Add(-1)
			return
		}
		healthyInFlight.Add(-1)
		if r.Outcome == webhooktest.Accepted {
			healthyAccepted.Add(1)
		}
	}
	l, _ := w.lane(t, func(c *Config) {
		c.Workers = 128
		c.MaxInFlightPerSubscription = 64
		// The slow subscription stays in the fast lane: what is tested is
		// the limit, not isolation.
		c.IsolateAfter, c.HoldLimit, c.MaxWaitingAge = time.Hour, time.Hour, time.Hour
	})
	as := assets(100)
	w.produce(t, as, 10)
	healthy := 3 * len(as) * 10
	testkit.Eventually(t, 120*time.Second, func() string {
		n := healthyAccepted.Load()
		return testkit.Unless(n >= int64(healthy), "healthy subscriptions accepted %d of %d", n, healthy)
	})
	st := l.Stats()
	t.Logf("live limit %+v; slow subscription's peak %d, the healthy ones' beside it %d", st, slowPeak.Load(), healthyPeakBesideSlow.Load())
	if p := slowPeak.Load(); p < 32 {
		t.Fatalf("the slow subscription had at most %d requests in flight: the test needs it to hold many", p)
	}
	if p := healthyPeakBesideSlow.Load(); p < 8 {
		t.Fatalf("the healthy subscriptions had at most %d requests at their endpoint while the slow one held 32 or more", p)
	}
	if st.InFlightLimitHighest > 128 {
		t.Fatalf("live limit reached %d, above Workers (128)", st.InFlightLimitHighest)
	}
	w.checkClean(t)
}
