package e2e_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/e2e"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/outbox"
)

// TestOperationalEventsConvergeForAFailingSubscriberOfThemselves: a
// subscription S that takes every event, the operational ones included,
// and whose endpoint always answers 500. One domain event dies at S, which
// announces bridge.delivery.dead — routed to S as well, where it dies too.
// Without the guard every such death would announce another, forever (up to
// the disable). With it, the whole story is exactly three operational
// events: the domain event's death, the 50% warning the second death
// reaches, and the disable the third one causes (WEBHOOK_DISABLE_AFTER=3).
// Then nothing is left to do anywhere (no NEW outbox row, no unconsumed
// record, no open delivery), so nothing more can ever be announced. A
// healthy subscriber (the pipeline's own) receives all three, in order, from
// the real broker.
//
// On both delivery paths: with the fast lane (the default) the first attempt
// is the fast lane's, the stream is parked, and the deaths and their
// announcements are the slow lane's.
func TestOperationalEventsConvergeForAFailingSubscriberOfThemselves(t *testing.T) {
	t.Run("fast lane", func(t *testing.T) { testOperationalEventsConverge(t, true) })
	t.Run("row engine", func(t *testing.T) { testOperationalEventsConverge(t, false) })
}

func testOperationalEventsConverge(t *testing.T, fastLane bool) {
	p := realPipeline(t, 3, true, e2e.Config{DisableAfter: 3})
	ctx := context.Background()

	var failed atomic.Int64
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		failed.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer broken.Close()
	subs := store.NewSubscriptionStore(p.DB.Pool, true, 0)
	url := broken.URL + "/hook"
	s, err := subs.Create(ctx, store.SubscriptionInput{URL: &url, EventTypes: []string{"*"}})
	if err != nil {
		t.Fatal(err)
	}

	// The pipeline's deliverers make one attempt: a failure is dead at once.
	// The fast lane's attempt comes first, then the slow lane's.
	attempts := 1
	if fastLane {
		attempts = 2
		p.StartFastLane()
	} else {
		p.StartConsumerAndDeliverer()
	}
	p.StartRelay(0)
	domainID := p.Enqueue(ctx, "a1", `{"n":1}`)

	type opRow struct {
		ID, EventType string
		Payload       json.RawMessage
	}
	opsRows := func() []opRow {
		return pgtest.Structs[opRow](t, p.DB.Pool, `SELECT id::text, event_type, payload FROM bridge.outbox WHERE topic = $1 ORDER BY seq`, p.OperationsTopic)
	}
	// Converged: S disabled, every outbox row sent and consumed, no delivery
	// open — nothing can announce anything any more. Consumed: in the
	// consumer's inbox (row engine), or committed past by the fast lane's
	// group.
	testkit.Eventually(t, 90*time.Second, func() string {
		var enabled bool
		var notSent, notConsumed, open int
		err := p.DB.Pool.QueryRow(ctx, `
SELECT (SELECT enabled FROM bridge.subscriptions WHERE id = $1),
       (SELECT count(*) FROM bridge.outbox WHERE status <> 'SENT'),
       CASE WHEN $2 THEN 0 ELSE (SELECT count(*) FROM bridge.outbox o WHERE NOT EXISTS (SELECT 1 FROM bridge.consumer_inbox i WHERE i.dedup_id = o.id::text)) END,
       (SELECT count(*) FROM bridge.deliveries WHERE status IN ('pending', 'delivering'))`, s.ID, fastLane).
			Scan(&enabled, &notSent, &notConsumed, &open)
		if err != nil {
			return err.Error()
		}
		if fastLane {
			notConsumed = int(kafkatest.GroupBehind(t, p.Brokers, "g-"+p.Topic, p.Topic, p.OperationsTopic))
		}
		return testkit.Unless(!enabled && notSent == 0 && notConsumed == 0 && open == 0,
			"S enabled=%v, outbox rows not sent %d, not consumed %d, deliveries open %d", enabled, notSent, notConsumed, open)
	})

	got := opsRows()
	var types []string
	for _, r := range got {
		types = append(types, r.EventType)
	}
	want := []string{contract.OpDeliveryDead, contract.OpSubscriptionFailing, contract.OpSubscriptionDisabled}
	if !slices.Equal(types, want) {
		t.Fatalf("operational events %v, want exactly %v", types, want)
	}
	var dead contract.DeliveryDead
	var failing contract.SubscriptionFailing
	var disabled contract.SubscriptionDisabled
	for i, v := range []any{&dead, &failing, &disabled} {
		if err := json.Unmarshal(got[i].Payload, v); err != nil {
			t.Fatalf("%s payload %s: %v", got[i].EventType, got[i].Payload, err)
		}
	}
	if dead.SubscriptionID != s.ID || dead.EventID != domainID || dead.Topic != p.Topic || dead.Cause != contract.CauseAttempts ||
		dead.StatusCode != 500 || dead.Attempts != attempts || dead.AssetID == nil || *dead.AssetID != "a1" {
		t.Errorf("delivery.dead payload %s", got[0].Payload)
	}
	if failing.SubscriptionID != s.ID || failing.Percent != 50 || failing.ConsecutiveFailures != 2 || failing.DisableAfter != 3 {
		t.Errorf("subscription.failing payload %s", got[1].Payload)
	}
	if disabled.SubscriptionID != s.ID || disabled.Cause != contract.CauseFailures || disabled.ConsecutiveFailures != 3 || disabled.Reason == "" {
		t.Errorf("subscription.disabled payload %s", got[2].Payload)
	}
	// S was sent the domain event and the first two announcements (the third
	// came after it was disabled), one attempt each on the row engine; on
	// the fast lane two each (its own try, then the slow lane's), and the
	// third may be sent once with the routes read before the disable (its
	// hand-over is then dropped: nothing is queued for a disabled
	// subscription).
	if n := failed.Load(); n < int64(3*attempts) || n > int64(3*attempts+attempts-1) {
		t.Errorf("the failing endpoint got %d requests, want %d to %d", n, 3*attempts, 3*attempts+attempts-1)
	}

	// The healthy subscriber got every one of them, in order.
	testkit.Eventually(t, 30*time.Second, func() string {
		for _, r := range got {
			if len(p.Recv.Traceparents(r.ID)) == 0 {
				return "healthy subscriber has not got " + r.EventType
			}
		}
		return ""
	})
	if st := p.Recv.Stats(); st.OrderViolations != 0 || st.SignatureFailures != 0 {
		t.Errorf("healthy subscriber: %+v", st)
	}

	// And they are on the broker, keyed by the subscription, with the
	// contract's headers.
	recs := kafkatest.ConsumeAll(t, p.Brokers, p.OperationsTopic, 3, 30*time.Second)
	if len(recs) != 3 {
		t.Fatalf("%d records on %s, want 3", len(recs), p.OperationsTopic)
	}
	for i, rec := range recs {
		ev, err := contract.Decode(rec)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if ev.EventType != want[i] || string(rec.Key) != contract.OperationsAssetForSubscription(s.ID) || ev.DedupID != got[i].ID {
			t.Errorf("record %d: type %s key %s id %s, want %s %s %s", i, ev.EventType, rec.Key, ev.DedupID,
				want[i], contract.OperationsAssetForSubscription(s.ID), got[i].ID)
		}
	}
}

// TestParkedRowIsAnnouncedInTheParkingTransaction: a row the relay parks as
// FAILED (here: over RELAY_MAX_MESSAGE_BYTES) is announced as
// bridge.outbox.failed, which the same relay then sends to the real broker;
// a parked row of the operations topic itself is not announced (when that
// topic cannot be produced to, each announcement would be parked and
// announced in turn).
func TestParkedRowIsAnnouncedInTheParkingTransaction(t *testing.T) {
	p := realPipeline(t, 1, true, e2e.Config{})
	ctx := context.Background()
	big := `{"blob":"` + strings.Repeat("x", 1500) + `"}`
	bigID := p.Enqueue(ctx, "a1", big)
	var opsBigID string
	err := pgx.BeginFunc(ctx, p.DB.Pool, func(tx pgx.Tx) error {
		id, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: p.OperationsTopic, AssetID: "x", EventType: "test.big", Payload: json.RawMessage(big)})
		opsBigID = id.String()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	p.StartRelay(1000)

	recs := kafkatest.ConsumeAll(t, p.Brokers, p.OperationsTopic, 1, 60*time.Second)
	if len(recs) != 1 {
		t.Fatalf("%d records on the operations topic, want 1", len(recs))
	}
	ev, err := contract.Decode(recs[0])
	if err != nil {
		t.Fatal(err)
	}
	var f contract.OutboxFailed
	if err := json.Unmarshal(ev.Payload, &f); err != nil {
		t.Fatal(err)
	}
	if ev.EventType != contract.OpOutboxFailed || string(recs[0].Key) != contract.OperationsAssetForTopic(p.Topic) ||
		f.ID != bigID || f.Topic != p.Topic || f.AssetID == nil || *f.AssetID != "a1" || f.AssetSeq != 1 ||
		f.EventType != "asset.updated" || f.Attempts != 1 || f.Error == "" || f.FailedAt.IsZero() {
		t.Errorf("record %s key %s: %s", ev.EventType, recs[0].Key, ev.Payload)
	}
	for _, id := range []string{bigID, opsBigID} {
		if st := p.OutboxStatus(id); st != "FAILED" {
			t.Errorf("row %s is %s, want FAILED", id, st)
		}
	}
	var n int
	if err := p.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.outbox WHERE event_type = $1`, contract.OpOutboxFailed).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d outbox.failed rows (%v), want 1: the parked operations row must not be announced", n, err)
	}
}
