package consumer

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/logging"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/testkit"
)

func TestMain(m *testing.M) {
	if os.Getenv(memberEnv) != "" {
		os.Exit(runMember())
	}
	goleak.VerifyTestMain(m)
}

// testBundle is one test's world: its own database, a fresh topic on the
// backend's cluster (kfake or the real broker: every suite test runs on
// both), a group name nobody else uses, and a producer.
type testBundle struct {
	db       *pgtest.DB
	brokers  []string
	topic    string
	group    string
	producer *kgo.Client
}

func setup(t testing.TB, be kafkatest.Backend, partitions int32) *testBundle {
	t.Helper()
	db := pgtest.New(t)
	brokers := be.Brokers(t)
	topic := kafkatest.CreateTopic(t, brokers, partitions, nil)
	producer := kafkatest.Client(t, brokers)
	return &testBundle{db: db, brokers: brokers, topic: topic, group: "g-" + topic, producer: producer}
}

// runSuite runs test in parallel once per Kafka backend
// (kafkatest.RunParallel), with a bundle whose topic has the given
// partitions.
func runSuite(t *testing.T, partitions int32, test func(t *testing.T, b *testBundle)) {
	t.Helper()
	kafkatest.RunParallel(t, func(t *testing.T, be kafkatest.Backend) {
		test(t, setup(t, be, partitions))
	})
}

// newConsumer builds a consumer on the bundle's topic and group; mutate
// adjusts the config.
func (b *testBundle) newConsumer(t testing.TB, mutate func(*Config)) *Consumer {
	t.Helper()
	cfg := Config{
		Group:          b.group,
		Topics:         []string{b.topic},
		RetryBackoff:   20 * time.Millisecond,
		Logger:         logging.New(t.Output(), "info", "text"),
		MaxPollRecords: 500,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := New(b.db.Pool, []kgo.Opt{kgo.SeedBrokers(b.brokers...)}, cfg)
	if err != nil {
		t.Fatalf("consumer.New: %v", err)
	}
	return c
}

// start runs c until the returned stop is called (or the test ends) and
// returns what Run returned. done is closed when Run returns by itself.
func start(t testing.TB, c *Consumer) (stop func() error, done <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan struct{})
	var runErr error
	go func() {
		defer close(ch)
		runErr = c.Run(ctx)
	}()
	stopped := false
	stop = func() error {
		cancel()
		select {
		case <-ch:
		case <-time.After(60 * time.Second):
			t.Fatalf("Run did not return within 60s of cancel")
		}
		stopped = true
		return runErr
	}
	t.Cleanup(func() {
		if !stopped {
			if err := stop(); err != nil && !errors.Is(err, errCrash) {
				t.Errorf("Run: %v", err)
			}
		}
	})
	return stop, ch
}

// subscribe inserts a subscription with plain SQL and returns its id.
func (b *testBundle) subscribe(t testing.TB, eventTypes []string, topic *string, enabled bool) string {
	t.Helper()
	var id string
	err := b.db.Pool.QueryRow(context.Background(),
		`INSERT INTO bridge.subscriptions (url, event_types, topic, enabled) VALUES ($1, $2, $3, $4) RETURNING id::text`,
		"https://example.com/hook", eventTypes, topic, enabled).Scan(&id)
	if err != nil {
		t.Fatalf("insert subscription: %v", err)
	}
	return id
}

// record builds a record the way the relay does: key = asset (empty = null
// asset), the contract's headers, a fresh dedup id.
func (b *testBundle) record(asset, eventType string, assetSeq int64, payload string) *kgo.Record {
	return &kgo.Record{
		Topic: b.topic,
		Key:   []byte(asset),
		Value: []byte(payload),
		Headers: []kgo.RecordHeader{
			{Key: contract.HeaderDedupID, Value: []byte(uuid.NewString())},
			{Key: contract.HeaderEventType, Value: []byte(eventType)},
			{Key: contract.HeaderAssetSeq, Value: []byte(strconv.FormatInt(assetSeq, 10))},
			{Key: contract.HeaderContentType, Value: []byte("application/json")},
		},
	}
}

// produce writes recs synchronously, failing the test on any error; the
// records get their partition and offset.
func (b *testBundle) produce(t testing.TB, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// createTopic creates name (for "<topic>.dlq") and deletes it at the end.
func (b *testBundle) createTopic(t testing.TB, name string, partitions int32) {
	t.Helper()
	kafkatest.CreateTopicNamed(t, b.brokers, name, partitions, nil)
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func (b *testBundle) count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("count %q: %v", query, err)
	}
	return n
}

func (b *testBundle) deliveries(t testing.TB) int {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM bridge.deliveries`)
}

// waitDeliveries waits until exactly want deliveries exist (failing on more).
func (b *testBundle) waitDeliveries(t testing.TB, want int, timeout time.Duration) {
	t.Helper()
	testkit.Eventually(t, timeout, func() string {
		n := b.deliveries(t)
		if n > want {
			t.Fatalf("%d deliveries, want %d", n, want)
		}
		return testkit.Unless(n == want, "%d of %d deliveries", n, want)
	})
}

// committed returns the group's committed offsets for the bundle's topic.
func (b *testBundle) committed(t testing.TB) map[int32]int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resps, err := kadm.NewClient(cl).FetchOffsets(ctx, b.group)
	if err != nil {
		t.Fatalf("fetch offsets: %v", err)
	}
	out := map[int32]int64{}
	resps.Each(func(o kadm.OffsetResponse) {
		if o.Topic == b.topic && o.Err == nil && o.At >= 0 {
			out[o.Partition] = o.At
		}
	})
	return out
}
