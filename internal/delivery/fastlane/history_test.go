package fastlane

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/delivery/kafkawindow"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/logging"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// TestHistoryFromKafkaGoesFirstThenLiveThenBackToTheFastLane: with the fast
// lane on, a subscription created with --since gets its history read from
// the topic by time, then the events produced meanwhile and after, every
// stream from asset_seq 1 up with no gap, no reordering and no overlap at
// the seam; once its backlog is drained its streams are back in the fast
// lane (no park marker left) and later events still arrive in order.
func TestHistoryFromKafkaGoesFirstThenLiveThenBackToTheFastLane(t *testing.T) {
	w := newWorld(t, 3, 0)
	as := assets(12)
	w.produce(t, as, 5) // the history: asset_seq 1–5 of every asset
	_, stopLane := w.lane(t, nil)
	defer stopLane()
	src := &kafkawindow.Source{Opts: []kgo.Opt{kgo.SeedBrokers(w.brokers...)}, Topics: []string{w.topic}, Settle: 3 * time.Second}
	d, err := delivery.NewDeliverer(w.db.Pool, delivery.Config{
		AllowedCIDRs: loopback, PollInterval: 50 * time.Millisecond, HistoryFromKafka: src,
		RetrySchedule: []time.Duration{50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond},
		Logger:        logging.New(t.Output(), "info", "text"),
	})
	if err != nil {
		t.Fatal(err)
	}
	stopSlow := run(t, d.Run)
	defer stopSlow()

	ctx := context.Background()
	url, since := w.srv.URL+"/history", time.Now().Add(-time.Hour)
	sub, err := store.NewSubscriptionStore(w.db.Pool, true, time.Hour).Create(ctx, store.SubscriptionInput{
		URL: &url, EventTypes: []string{"*"}, Since: &since})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.recv.SetSecret("/history", sub.Secret); err != nil {
		t.Fatal(err)
	}
	// Live events while the history waits to be read, until the lane
	// routes them to the new subscription: a marker (parked, behind the
	// history) or a request at the endpoint (sent ahead of its history:
	// the receiver counts it as out of order).
	testkit.Eventually(t, 30*time.Second, func() string {
		w.produce(t, as, 1)
		parked := w.count(t, `SELECT count(*) FROM bridge.delivery_parks WHERE subscription_id = $1`, sub.ID)
		return testkit.Unless(parked > 0 || w.recv.Stats().Requests > 0, "the lane routes nothing to the new subscription yet")
	})
	w.produce(t, as, 2)
	before := int(w.seq[as[0]]) // events per asset produced before the copy
	testkit.Eventually(t, 60*time.Second, func() string {
		return testkit.Unless(w.count(t, `SELECT count(*) FROM bridge.subscriptions WHERE id = $1 AND history_done_at IS NOT NULL`, sub.ID) == 1,
			"history not copied yet")
	})
	if n := w.count(t, `SELECT history_copied::int FROM bridge.subscriptions WHERE id = $1`, sub.ID); n < len(as)*5 {
		t.Fatalf("history copied %d deliveries, want at least the %d events before the subscription", n, len(as)*5)
	}
	w.produce(t, as, 5) // after the copy
	w.waitAccepted(t, len(as)*(before+5), 90*time.Second)
	w.checkClean(t)
	testkit.Eventually(t, 30*time.Second, func() string {
		n := w.count(t, `SELECT count(*) FROM bridge.delivery_parks WHERE subscription_id = $1`, sub.ID)
		return testkit.Unless(n == 0, "%d streams still parked after the backlog drained", n)
	})
	w.produce(t, as, 5) // back in the fast lane
	w.waitAccepted(t, len(as)*(before+10), 60*time.Second)
	w.checkClean(t)
	if n := w.count(t, `SELECT count(*) FROM bridge.deliveries WHERE subscription_id = $1 AND asset_seq > $2`, sub.ID, before+5); n != 0 {
		t.Errorf("%d of the events after the hand-back went through the slow lane; want every one from the fast lane", n)
	}
}
