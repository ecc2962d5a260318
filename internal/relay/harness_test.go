package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/outbox"
)

// testBundle is one test's database, broker and relays.
type testBundle struct {
	t       *testing.T
	db      *pgtest.DB
	brokers []string
}

func setup(t *testing.T, brokers []string) *testBundle {
	t.Helper()
	return &testBundle{t: t, db: pgtest.New(t), brokers: brokers}
}

// setupFake is the opening of a test that injects broker faults through
// kfake's control hooks (so it runs on kfake only): it marks t parallel and
// returns a kfake cluster holding topic with the given partitions, and a
// bundle on that cluster.
func setupFake(t *testing.T, topic string, partitions int32) (*kfake.Cluster, *testBundle) {
	t.Helper()
	t.Parallel()
	cluster := kafkatest.Fake(t)
	if err := cluster.CreateTopic(topic, partitions, nil); err != nil {
		t.Fatal(err)
	}
	return cluster, setup(t, cluster.ListenAddrs())
}

// runSuite runs test in parallel once per Kafka backend
// (kafkatest.RunParallel), with a bundle over a database of its own and the
// backend's brokers.
func runSuite(t *testing.T, test func(t *testing.T, b *testBundle)) {
	t.Helper()
	kafkatest.RunParallel(t, func(t *testing.T, be kafkatest.Backend) {
		test(t, setup(t, be.Brokers(t)))
	})
}

// fastConfig is a relay config with test-sized timings.
func fastConfig() Config {
	var logger *slog.Logger
	if os.Getenv("RELAY_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return Config{
		Logger:         logger,
		MaxAttempts:    10,
		BackoffBase:    50 * time.Millisecond,
		BackoffMax:     500 * time.Millisecond,
		BatchSize:      500,
		PollInterval:   100 * time.Millisecond,
		LeaseTimeout:   2 * time.Second,
		ProduceTimeout: 2 * time.Second,
	}
}

// runningRelay is a relay started in the background.
type runningRelay struct {
	relay  *Relay
	client *kgo.Client
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when Run returned
	err    error         // Run's result, valid after done
	once   sync.Once
}

func (rr *runningRelay) closeClient() { rr.once.Do(rr.client.Close) }

// stop shuts the relay down gracefully and returns Run's error.
func (rr *runningRelay) stop() error {
	rr.cancel(nil)
	<-rr.done
	rr.closeClient()
	return rr.err
}

// crash stops the relay as a killed process would: no lanes released.
func (rr *runningRelay) crash() {
	rr.cancel(errSimulatedCrash)
	<-rr.done
	rr.closeClient()
}

func (b *testBundle) startRelay(cfg Config, extra ...kgo.Opt) *runningRelay {
	b.t.Helper()
	return b.startRelayWithHook(cfg, nil, extra...)
}

// startRelayWithHook starts a relay whose cycle calls crashAfterProduce
// between produce and mark.
func (b *testBundle) startRelayWithHook(cfg Config, crashAfterProduce func() bool, extra ...kgo.Opt) *runningRelay {
	b.t.Helper()
	if cfg.Logger == nil {
		// Warnings and errors go to the test's log (shown when it fails): a
		// test that timed out with every row NEW said nothing about why.
		cfg.Logger = slog.New(slog.NewTextHandler(testLog{b.t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	opts := append([]kgo.Opt{kgo.SeedBrokers(b.brokers...)}, ProducerOptions(cfg)...)
	opts = append(opts, extra...)
	client, err := kgo.NewClient(opts...)
	if err != nil {
		b.t.Fatalf("kafka client: %v", err)
	}
	r := New(b.db.Pool, client, cfg)
	r.testCrashAfterProduce = crashAfterProduce
	ctx, cancel := context.WithCancelCause(context.Background())
	rr := &runningRelay{relay: r, client: client, cancel: cancel, done: make(chan struct{})}
	go func() { rr.err = r.Run(ctx); close(rr.done) }()
	b.t.Cleanup(func() { _ = rr.stop() })
	return rr
}

// testLog writes a relay's log lines to its test's log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Helper()
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (b *testBundle) enqueue(events ...outbox.Event) []uuid.UUID {
	b.t.Helper()
	ctx := context.Background()
	var ids []uuid.UUID
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		ids, err = outbox.EnqueueBatch(ctx, tx, events)
		return err
	})
	if err != nil {
		b.t.Fatalf("enqueue: %v", err)
	}
	return ids
}

func payload(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// countStatus returns how many outbox rows have each status.
func (b *testBundle) countStatus() map[string]int {
	b.t.Helper()
	out := map[string]int{}
	rows, err := b.db.Pool.Query(context.Background(), `SELECT status, count(*) FROM bridge.outbox GROUP BY status`)
	if err != nil {
		b.t.Fatalf("count: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			b.t.Fatal(err)
		}
		out[s] = n
	}
	return out
}

func (b *testBundle) waitAllSent(total int, timeout time.Duration) {
	b.t.Helper()
	testkit.Eventually(b.t, timeout, func() string {
		c := b.countStatus()
		return testkit.Unless(c["SENT"] == total, "%s: %s", fmt.Sprintf("%d rows SENT", total), fmt.Sprint(c))
	})
}

// outboxRow is a row as the tests inspect it.
type outboxRow struct {
	ID        uuid.UUID
	Status    string
	Attempts  int
	LastError string
	SentAt    *time.Time
	FailedAt  *time.Time
}

func (b *testBundle) row(id uuid.UUID) outboxRow {
	b.t.Helper()
	var r outboxRow
	err := b.db.Pool.QueryRow(context.Background(),
		`SELECT id, status, attempts, coalesce(last_error, ''), sent_at, failed_at FROM bridge.outbox WHERE id = $1`, id).
		Scan(&r.ID, &r.Status, &r.Attempts, &r.LastError, &r.SentAt, &r.FailedAt)
	if err != nil {
		b.t.Fatalf("read row %s: %v", id, err)
	}
	return r
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// checkKeyOrder asserts that, per key, the first copy of each dedup-id
// arrives in strictly increasing asset-seq order with no gaps starting at 1
// (duplicates — the same dedup-id again — are allowed: at least once).
func checkKeyOrder(t *testing.T, recs []*kgo.Record) map[string][]int64 {
	t.Helper()
	seen := map[string]bool{}
	perKey := map[string][]int64{}
	partOf := map[string]int32{}
	for _, r := range recs {
		id := header(r, "dedup-id")
		if seen[id] {
			continue
		}
		seen[id] = true
		k := string(r.Key)
		if p, ok := partOf[k]; ok && p != r.Partition {
			t.Fatalf("key %q on two partitions (%d and %d)", k, p, r.Partition)
		}
		partOf[k] = r.Partition
		n, err := strconv.ParseInt(header(r, "asset-seq"), 10, 64)
		if err != nil {
			t.Fatalf("record without asset-seq: %v", err)
		}
		perKey[k] = append(perKey[k], n)
	}
	for k, seqs := range perKey {
		for i, s := range seqs {
			if s != int64(i+1) {
				t.Fatalf("key %q: position %d has asset-seq %d, want %d (first 20: %v)", k, i, s, i+1, seqs[:min(20, len(seqs))])
			}
		}
	}
	return perKey
}

// sortByOffset orders records of one partition as Kafka stores them (the
// consumer returns partitions interleaved; order only matters per partition).
func byPartition(recs []*kgo.Record) map[int32][]*kgo.Record {
	out := map[int32][]*kgo.Record{}
	for _, r := range recs {
		out[r.Partition] = append(out[r.Partition], r)
	}
	return out
}
