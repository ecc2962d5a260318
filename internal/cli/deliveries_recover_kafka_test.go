package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/kafkatest"
)

// TestDeliveriesRecoverWithTheFastLaneReadsKafkaByTime: with
// WEBHOOK_FAST_LANE=true, recover reads the window from CONSUMER_TOPICS by
// time and queues its events for the subscription in asset order; a window
// past the topic's retention exits 2 naming --since and the earliest time
// still available, writing nothing; so is `subscriptions create --since`.
func TestDeliveriesRecoverAndHistoryWithTheFastLaneReadKafkaByTime(t *testing.T) {
	db, ctx := webhookCLIEnv(t)
	brokers := kafkatest.RealBrokers(t)
	topic := kafkatest.CreateTopic(t, brokers, 1, nil)
	t.Setenv("WEBHOOK_FAST_LANE", "true")
	t.Setenv("KAFKA_BROKERS", strings.Join(brokers, ","))
	t.Setenv("CONSUMER_TOPICS", topic)
	sub := insertSubscription(t, db)

	base := time.Now().Add(-5 * time.Hour).Truncate(time.Millisecond)
	cl := kafkatest.Client(t, brokers)
	var recs []*kgo.Record
	for i := range 6 {
		asset := "a-1"
		r := contract.Encode(contract.Event{DedupID: uuid.NewString(), Topic: topic, AssetID: &asset, AssetSeq: int64(i + 1),
			EventType: "asset.updated", Payload: []byte(`{}`), CreatedAt: base})
		r.Timestamp = base.Add(time.Duration(i) * time.Hour / 2)
		recs = append(recs, r)
	}
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := cl.ProduceSync(pctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var del kadm.Offsets
	del.Add(kadm.Offset{Topic: topic, Partition: 0, At: 1})
	if dr, err := kadm.NewClient(cl).DeleteRecords(pctx, del); err != nil || dr.Error() != nil {
		t.Fatalf("delete records: %v %v", err, dr.Error())
	}
	earliest := base.Add(30 * time.Minute).UTC().Format(time.RFC3339Nano)
	// A dead delivery of the window: a refused recover must not revive it.
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at,
  status, attempts, dead_at, last_error, created_at)
VALUES ($1::uuid, 'dead-in-window', 'asset.updated', $2, 'a-9', 1, '{}', now(), 'dead', 9, now(), 'HTTP 500', now() - interval '1 hour')`,
		sub, topic); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runBridge(t, "deliveries", "recover", "--subscription", sub, "--since", base.UTC().Format(time.RFC3339Nano))
	if code != ExitUsage || !strings.Contains(errOut, "--since") || !strings.Contains(errOut, "earliest time still available is "+earliest) {
		t.Fatalf("recover past retention: exit %d, stderr %q (stdout %q); want exit 2 naming --since and %s", code, errOut, out, earliest)
	}
	// The same refusal for a new subscription's history.
	code, out, errOut = runBridge(t, "subscriptions", "create", "--url", "http://127.0.0.1:9/in", "--event-types", "*",
		"--since", base.UTC().Format(time.RFC3339Nano))
	if code != ExitUsage || !strings.Contains(errOut, "--since") || !strings.Contains(errOut, "earliest time still available is "+earliest) {
		t.Fatalf("create --since past retention: exit %d, stderr %q (stdout %q); want exit 2 naming --since and %s", code, errOut, out, earliest)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries WHERE status = 'dead'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("a refused recover revived a dead delivery: %d dead left, want 1 (err %v)", n, err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.subscriptions`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d subscriptions after a refused create, want the 1 there was (err %v)", n, err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("a refused recover wrote %d deliveries besides the dead one (err %v)", n-1, err)
	}

	out = mustRunBridge(t, "deliveries", "recover", "--subscription", sub, "--since", earliest, "-o", "json")
	var res struct {
		Recovered int `json:"recovered"`
		Queued    int `json:"queued_from_kafka"`
		Read      int `json:"read_from_kafka"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Queued != 5 || res.Read != 5 || res.Recovered != 1 {
		t.Fatalf("recover from the earliest time: %s (err %v); want the dead one revived, 5 read and 5 queued", out, err)
	}
}
