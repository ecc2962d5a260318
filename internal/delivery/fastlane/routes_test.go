package fastlane

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/webhooktest"
)

// A subscription created and committed before an event's transaction began
// gets that event, however soon after the creation the event comes: twenty
// subscriptions created one after another, each followed at once by an
// event whose created-at is PostgreSQL's now() after the creation (what
// bridge.enqueue stamps). Subscription j must get every event from the j-th
// on. The refresh interval is the production one (1 s), so without the
// version check each event is fanned out with routes up to a second old.
func TestFastLaneRoutesEachEventToTheSubscriptionsCreatedBeforeIt(t *testing.T) {
	w := newWorld(t, 4, 0)
	var mu sync.Mutex
	got := map[string]map[string]bool{} // subscription path → assets received
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if r.Envelope.AssetID != nil {
			mu.Lock()
			if got[r.Subscription] == nil {
				got[r.Subscription] = map[string]bool{}
			}
			got[r.Subscription][*r.Envelope.AssetID] = true
			mu.Unlock()
		}
		return http.StatusNoContent, 0
	}
	l, _ := w.lane(t, func(c *Config) { c.RefreshInterval = time.Second })
	// The member owns the partitions before the first event: an event read
	// at the first assignment would meet routes read just then.
	testkit.Eventually(t, 30*time.Second, func() string {
		n := len(l.Gauges().Partitions)
		return testkit.Unless(n == 4, "the lane owns %d of 4 partitions", n)
	})
	// The first event proves the lane is reading before the subscriptions
	// come (it is routed to none).
	w.produce(t, []string{"warm-up"}, 1)
	testkit.Eventually(t, 30*time.Second, func() string {
		n := l.Stats().Records
		return testkit.Unless(n == 1, "the lane read %d records, want the warm-up", n)
	})

	const n = 20
	ss := store.NewSubscriptionStore(w.db.Pool, true, time.Hour)
	ctx := context.Background()
	paths := make([]string, n)
	for i := range n {
		paths[i] = fmt.Sprintf("/new/%d", i)
		url := w.srv.URL + paths[i]
		sub, err := ss.Create(ctx, store.SubscriptionInput{URL: &url, EventTypes: []string{"*"}})
		if err != nil {
			t.Fatalf("create subscription: %v", err)
		}
		if err := w.recv.SetSecret(paths[i], sub.Secret); err != nil {
			t.Fatal(err)
		}
		// The event's transaction begins after the creation committed.
		began := pgtest.Column[time.Time](t, w.db.Pool, `SELECT now()`)[0]
		asset := fmt.Sprintf("asset-%02d", i)
		r := contract.Encode(contract.Event{
			DedupID: uuid.NewString(), Topic: w.topic, AssetID: &asset, AssetSeq: 1,
			EventType: "asset.created", Payload: fmt.Appendf(nil, `{"n":%d}`, i), CreatedAt: began,
		})
		if err := w.producer.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	missing := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for j := range n {
			for i := j; i < n; i++ {
				if asset := fmt.Sprintf("asset-%02d", i); !got[paths[j]][asset] {
					out = append(out, fmt.Sprintf("%s lacks %s", paths[j], asset))
				}
			}
		}
		return out
	}
	testkit.Eventually(t, 30*time.Second, func() string {
		m := missing()
		return testkit.Unless(len(m) == 0, "%d deliveries missing (of %d), e.g. %v; lane stats %+v",
			len(m), n*(n+1)/2, m[:min(len(m), 5)], l.Stats())
	})
	w.checkClean(t)
	if st := l.Stats(); st.RouteChecks == 0 {
		t.Errorf("stats %+v: want version checks counted", st)
	}
}

// While the version check cannot be answered, records newer than the routes
// wait (none is fanned out with routes older than its event), and the lane
// says so: Waiting counts them, so /readyz's fast_lane_progress reports a
// stall instead of records hanging unseen. Once the check is answered they
// go out.
func TestFastLaneRecordsWaitingForTheVersionCheckAreReported(t *testing.T) {
	w := newWorld(t, 2, 1)
	w.recv.Respond = func(*webhooktest.Request) (int, time.Duration) { return http.StatusNoContent, 0 }
	l, _ := w.lane(t, func(c *Config) { c.RefreshInterval = time.Hour })
	testkit.Eventually(t, 30*time.Second, func() string {
		n := len(l.Gauges().Partitions)
		return testkit.Unless(n == 2, "the lane owns %d of 2 partitions", n)
	})
	w.produce(t, []string{"a"}, 1)
	w.waitAccepted(t, 1, 30*time.Second)

	// The check blocks behind a lock held on the version table.
	ctx := context.Background()
	tx, err := w.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `LOCK TABLE bridge.subscriptions_version IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	records := l.Stats().Records
	w.produce(t, []string{"a"}, 1)
	testkit.Eventually(t, 30*time.Second, func() string {
		why, err := l.Waiting(ctx)
		if err != nil {
			return err.Error()
		}
		return testkit.Unless(why != "", "Waiting reports nothing while a polled record waits for the check")
	})
	if st := l.Stats(); st.Records != records || w.recv.Stats().Accepted != 1 {
		t.Fatalf("a record newer than the routes was taken before the check answered: stats %+v, accepted %d", st, w.recv.Stats().Accepted)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	w.waitAccepted(t, 2, 30*time.Second)
	w.checkClean(t)
	testkit.Eventually(t, 10*time.Second, func() string {
		why, _ := l.Waiting(ctx)
		return testkit.Unless(why == "", "Waiting still reports %q after the record was delivered", why)
	})
}
