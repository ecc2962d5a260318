package fastlane

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/webhooktest"
)

// A request in flight past overdueAfter stops counting against the live
// limit. The lane starts at the limit's floor (8), and a subscription whose
// endpoint takes 4 s takes a place each time one of its streams comes up
// in the ready queue and keeps it: within milliseconds of the start its
// requests would hold all 8, and the healthy subscriptions would send
// nothing — and, with no success to sample, the limit would not grow —
// until its first answers came back. Overdue, its requests leave the
// places to the others: the healthy subscriptions deliver 600 events
// before the slow endpoint has answered any request. Isolation is off
// here: what is tested is the limit.
func TestFastLaneOverdueRequestsLeaveTheLimitToTheOthers(t *testing.T) {
	w := newWorld(t, 4, 4)
	slowPath := w.paths[0]
	const healthyBefore = 600
	var slowAnswered, healthyAccepted atomic.Int64
	slowAnsweredAt := atomic.Int64{}
	slowAnsweredAt.Store(-1)
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if r.Subscription == slowPath {
			return http.StatusNoContent, 4 * time.Second
		}
		return http.StatusNoContent, 0
	}
	w.recv.Observe = func(r *webhooktest.Request) {
		if r.Subscription == slowPath {
			slowAnswered.Add(1)
			return
		}
		if r.Outcome == webhooktest.Accepted && healthyAccepted.Add(1) == healthyBefore {
			slowAnsweredAt.Store(slowAnswered.Load())
		}
	}
	l, _ := w.lane(t, func(c *Config) {
		c.Workers = 128
		c.MaxInFlightPerSubscription = 64
		c.IsolateAfter, c.HoldLimit, c.MaxWaitingAge = time.Hour, time.Hour, time.Hour
	})
	w.produce(t, assets(100), 4)
	testkit.Eventually(t, 60*time.Second, func() string {
		n := healthyAccepted.Load()
		return testkit.Unless(n >= healthyBefore, "healthy subscriptions accepted %d of %d", n, healthyBefore)
	})
	st := l.Stats()
	t.Logf("live limit %+v; slow requests answered when the healthy ones reached %d: %d", st, healthyBefore, slowAnsweredAt.Load())
	if n := slowAnsweredAt.Load(); n != 0 {
		t.Fatalf("the slow endpoint had answered %d requests before the healthy subscriptions delivered %d events: "+
			"its requests held the live limit's places", n, healthyBefore)
	}
	if st.InFlightLimitLowest < 8 {
		t.Fatalf("live limit fell to %d, below its floor of 8", st.InFlightLimitLowest)
	}
	w.checkClean(t)
}
