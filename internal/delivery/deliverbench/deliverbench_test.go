package deliverbench

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

func TestRunDeliversEverythingInOrder(t *testing.T) {
	db := pgtest.NewParallel(t)
	res, err := Run(context.Background(), db.Pool, Options{
		Subscriptions: 2, Assets: 3, Events: 300, LiveEvents: 60, LiveRate: 300,
		Deliverer: delivery.Config{Workers: 8, PollInterval: 50 * time.Millisecond},
		Timeout:   2 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.OrderViolations != 0 || res.NotDelivered != 0 || res.Duplicates != 0 || res.Overlaps != 0 || res.SignatureFailures != 0 {
		t.Fatalf("violations=%d not delivered=%d duplicates=%d overlaps=%d signature failures=%d",
			res.OrderViolations, res.NotDelivered, res.Duplicates, res.Overlaps, res.SignatureFailures)
	}
	if res.DeliveriesPerSecond <= 0 || res.LatencyP99MS <= 0 || res.PeakHeapMiB <= 0 || res.CeilingPerSecond <= 0 {
		t.Fatalf("missing measurements: %+v", res)
	}
}

// The bench's server (fasthttp around webhooktest's checks) counts order
// violations and duplicates per subscription, refuses a bad signature, and
// tracks the requests in flight per subscription.
func TestReceiverCountsOrderViolations(t *testing.T) {
	t.Parallel()
	rc := newReceiver(2, 0, 0, 0)
	secret := store.NewSecret()
	if err := rc.SetSecret("", secret); err != nil {
		t.Fatal(err)
	}
	base, stop, err := rc.listen()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	do := func(req *http.Request) int {
		t.Helper()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	post := func(path string, seq int, id string) {
		t.Helper()
		asset := "a"
		n := int64(seq)
		body, err := contract.NewEnvelope(id, "bench.event", &asset, &n, time.Now(), []byte(`{"t":1}`)).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().Unix()
		sig, err := delivery.Sign([]string{secret}, id, now, body)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(body))
		contract.SetWebhookHeaders(req.Header, id, now, sig, "test")
		if code := do(req); code != http.StatusNoContent {
			t.Fatalf("%s %d: status %d", path, seq, code)
		}
	}
	post("/s/0", 1, "e1")
	post("/s/0", 2, "e2")
	post("/s/1", 1, "e1") // another stream: independent
	post("/s/0", 2, "e2") // a duplicate
	post("/s/0", 4, "e4") // 3 skipped: would arrive late
	post("/s/0", 3, "e3")
	body := []byte(`{"id":"e5","type":"bench.event","asset_id":"a","asset_seq":5,"timestamp":"2026-01-01T00:00:00Z","data":{}}`)
	req, _ := http.NewRequest(http.MethodPost, base+"/s/0", bytes.NewReader(body))
	contract.SetWebhookHeaders(req.Header, "e5", time.Now().Unix(), "v1,bm90IHRoZSBzaWduYXR1cmU=", "test")
	if code := do(req); code != http.StatusUnauthorized {
		t.Fatalf("bad signature: status %d, want 401", code)
	}
	if st := rc.Stats(); st.OrderViolations != 2 || st.Duplicates != 1 || st.SignatureFailures != 1 || st.Accepted != 5 {
		t.Fatalf("violations=%d duplicates=%d signature failures=%d accepted=%d, want 2, 1, 1 and 5",
			st.OrderViolations, st.Duplicates, st.SignatureFailures, st.Accepted)
	}
	if rc.peakSub.Load() != 1 || rc.backlog.Load() != 5 {
		t.Fatalf("peak in flight %d, backlog events counted %d; want 1 and 5", rc.peakSub.Load(), rc.backlog.Load())
	}
}

// The fast lane's run: everything delivered in order, and on the clean path
// PostgreSQL writes one attempt-log row per delivery and nothing else.
func TestRunFastLaneWritesOnlyTheAttemptLog(t *testing.T) {
	db := pgtest.NewParallel(t)
	brokers := kafkatest.RealBrokers(t)
	res, err := Run(context.Background(), db.Pool, Options{
		Subscriptions: 3, Assets: 20, Events: 600,
		Deliverer: delivery.Config{Workers: 16, PollInterval: 50 * time.Millisecond},
		Timeout:   2 * time.Minute,
		Kafka:     &FastLaneOptions{KafkaOpts: []kgo.Opt{kgo.SeedBrokers(brokers...)}, Partitions: 4},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.OrderViolations != 0 || res.NotDelivered != 0 || res.Overlaps != 0 || res.SignatureFailures != 0 {
		t.Fatalf("violations=%d not delivered=%d overlaps=%d signature failures=%d",
			res.OrderViolations, res.NotDelivered, res.Overlaps, res.SignatureFailures)
	}
	if res.Engine != "kafka" || res.DeliveriesPerSecond <= 0 || res.HandedOver != 0 {
		t.Fatalf("engine %q, %.0f/s, %d handed over", res.Engine, res.DeliveriesPerSecond, res.HandedOver)
	}
	// Every attempt is in the log (one insert each), also those flushed while
	// the lane stopped.
	if res.PostgresInsertsPerDelivery < 1 || res.PostgresInsertsPerDelivery > 1.1 ||
		res.PostgresUpdatesPerDelivery > 0.05 || res.PostgresDeletesPerDelivery > 0.05 {
		t.Fatalf("row writes per delivery: inserts %.3f, updates %.3f, deletes %.3f",
			res.PostgresInsertsPerDelivery, res.PostgresUpdatesPerDelivery, res.PostgresDeletesPerDelivery)
	}
}

// Three members: the group forms (each owns a share of the partitions)
// before the backlog is committed, and the drain has no order violation,
// overlap or duplicate across the members.
func TestRunFastLaneReplicasFormTheGroupFirst(t *testing.T) {
	db := pgtest.NewParallel(t)
	brokers := kafkatest.RealBrokers(t)
	res, err := Run(context.Background(), db.Pool, Options{
		Subscriptions: 3, Assets: 20, Events: 600, Replicas: 3,
		Deliverer: delivery.Config{Workers: 16, PollInterval: 50 * time.Millisecond},
		Timeout:   2 * time.Minute,
		Kafka:     &FastLaneOptions{KafkaOpts: []kgo.Opt{kgo.SeedBrokers(brokers...)}, Partitions: 6},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.OrderViolations != 0 || res.NotDelivered != 0 || res.Overlaps != 0 || res.Duplicates != 0 || res.SignatureFailures != 0 {
		t.Fatalf("violations=%d not delivered=%d overlaps=%d duplicates=%d signature failures=%d",
			res.OrderViolations, res.NotDelivered, res.Overlaps, res.Duplicates, res.SignatureFailures)
	}
	if res.Replicas != 3 || res.GroupFormSeconds <= 0 || res.DeliveriesPerSecond <= 0 {
		t.Fatalf("replicas %d, group formed in %.3fs, %.0f/s", res.Replicas, res.GroupFormSeconds, res.DeliveriesPerSecond)
	}
}
