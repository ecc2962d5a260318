package e2e_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/e2e"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/webhooktest"
)

// TestSubscriptionWithHistoryGetsEveryEventOnceInOrder: events flow through
// the whole bridge (real broker) while a subscription is created with
// --since and more events keep being written during its creation and its
// copy. The new subscriber must receive every event of every asset since
// then, exactly once, each asset's in asset_seq order from 1 with no gap
// (Gapless): the history, then the live events, with nothing lost or
// repeated at the seam.
func TestSubscriptionWithHistoryGetsEveryEventOnceInOrder(t *testing.T) {
	p := realPipeline(t, 3, false, e2e.Config{})
	ctx := context.Background()
	p.StartConsumerAndDeliverer()
	p.StartRelay(0)

	assets := []string{"a1", "a2", "a3", "a4"}
	n := 0
	write := func(k int) {
		for range k {
			for _, a := range assets {
				p.Enqueue(ctx, a, fmt.Sprintf(`{"n":%d}`, n))
			}
			n++
		}
	}
	write(30) // history: 120 events, delivered to the pipeline's own subscription
	testkit.Eventually(t, 60*time.Second, func() string {
		return testkit.Unless(p.Recv.Stats().Accepted == 4*n, "pipeline subscriber has %d of %d", p.Recv.Stats().Accepted, 4*n)
	})

	recv := webhooktest.New()
	recv.Gapless = true
	srv := httptest.NewServer(recv)
	defer srv.Close()
	subs := store.NewSubscriptionStore(p.DB.Pool, true, 0)
	url := srv.URL + "/s"
	since := time.Now().Add(-time.Hour)
	done := make(chan struct{})
	go func() { // live events while the subscription is created and copied
		defer close(done)
		for range 20 {
			write(1)
		}
	}()
	s, err := subs.Create(ctx, store.SubscriptionInput{URL: &url, EventTypes: []string{"*"}, Since: &since})
	if err != nil {
		t.Fatal(err)
	}
	if err := recv.SetSecret("", s.Secret); err != nil {
		t.Fatal(err)
	}
	<-done
	write(5)
	want := 4 * n
	testkit.Eventually(t, 90*time.Second, func() string {
		st := recv.Stats()
		return testkit.Unless(st.Accepted == want, "history subscriber has %d of %d events (%+v)", st.Accepted, want, st)
	})
	st := recv.Stats()
	if st.Duplicates != 0 || st.OrderViolations != 0 || st.Overlaps != 0 || st.SignatureFailures != 0 {
		t.Fatalf("history subscriber: %+v", st)
	}
	got, err := subs.Get(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.History == nil || got.History.DoneAt == nil || got.History.Copied < 120 {
		t.Errorf("history %+v, want done with at least the 120 events written before", got.History)
	}
}
