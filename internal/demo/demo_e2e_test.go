package demo_test

// End-to-end: the demo through cli.RunDemo, which is what `bridge demo` runs —
// the relay, the consumer and the deliverer of `bridge run` (runAll), moving
// events from bridge.enqueue through Kafka to a receiver that verifies every
// signature and per-(subscription, asset) order.

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/outboxbridge/bridge/internal/cli"
	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/demo"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/outboxstore"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testLogger writes the pipeline's logs into the test's output.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

// run is one demo run against db and, when brokers is nil, the embedded
// broker.
func run(t *testing.T, ctx context.Context, db *pgtest.DB, brokers []string, o demo.Options) (*demo.Summary, error) {
	t.Helper()
	env := map[string]string{"DATABASE_URL": db.URL}
	if len(brokers) > 0 {
		env["KAFKA_BROKERS"] = strings.Join(brokers, ",")
	}
	o.Progress = demo.ProgressNone
	return cli.RunDemo(ctx, cli.DemoParams{Env: env, Options: o, Logger: testLogger(t), Isolated: true})
}

// checkClean asserts the outcome of a full run: every event but the poison
// delivered with a valid signature and in order, the poison parked as
// FAILED; then that the run's rows are gone, or (--keep) that the database
// agrees with the summary.
func checkClean(t *testing.T, db *pgtest.DB, sum *demo.Summary, events int) {
	t.Helper()
	t.Logf("summary: %+v", *sum)
	if err := sum.Err(); err != nil {
		t.Errorf("Err() = %v", err)
	}
	if sum.OrderViolations != 0 || sum.SignatureFailures != 0 || sum.Malformed != 0 {
		t.Errorf("order violations %d, signature failures %d, malformed %d; want 0 (%q)", sum.OrderViolations, sum.SignatureFailures, sum.Malformed, sum.Problems)
	}
	if sum.Enqueued != events || sum.Poison != 1 {
		t.Errorf("enqueued %d (poison %d), want %d (1)", sum.Enqueued, sum.Poison, events)
	}
	if sum.Delivered != sum.Enqueued-sum.Poison || sum.Dead != 0 || sum.Missing != 0 {
		t.Errorf("delivered %d, dead %d, missing %d; want %d, 0, 0", sum.Delivered, sum.Dead, sum.Missing, sum.Enqueued-sum.Poison)
	}
	if sum.Relayed != sum.Enqueued-1 || sum.Failed != 1 {
		t.Errorf("relayed %d, FAILED %d; want %d, 1", sum.Relayed, sum.Failed, sum.Enqueued-1)
	}
	if sum.TracesContinued != sum.Delivered {
		t.Errorf("traces continued %d of %d: a webhook lost the trace of its enqueue", sum.TracesContinued, sum.Delivered)
	}
	if sum.Interrupted || sum.TimedOut {
		t.Errorf("interrupted %v, timed out %v", sum.Interrupted, sum.TimedOut)
	}
	// The receiver refused the third event of three assets once: each was
	// retried to success. With the fast lane, those streams went through
	// the slow lane and the rest came straight from the partitions.
	if sum.Refused != demo.DefaultRefusals {
		t.Errorf("refused %d attempts, want %d", sum.Refused, demo.DefaultRefusals)
	}
	if !sum.FastLane {
		t.Errorf("the demo ran without the fast lane")
	} else if sum.DeliveredSlowLane < demo.DefaultRefusals || sum.DeliveredFastLane == 0 ||
		sum.DeliveredFastLane+sum.DeliveredSlowLane != sum.Delivered {
		t.Errorf("fast lane %d + slow lane %d of %d delivered: want at least %d through the slow lane and the rest through the fast lane",
			sum.DeliveredFastLane, sum.DeliveredSlowLane, sum.Delivered, demo.DefaultRefusals)
	}
	if sum.LatencyP50 <= 0 || sum.LatencyP99 < sum.LatencyP50 {
		t.Errorf("latency p50 %v p99 %v", sum.LatencyP50, sum.LatencyP99)
	}

	ctx := context.Background()
	subs, err := store.NewSubscriptionStore(db.Pool, true, 0).List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !sum.Kept {
		// Nothing of the run is left: no subscription, no outbox row (the
		// parked poison would page whoever alerts on FAILED rows).
		var rows int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.outbox WHERE topic = $1`, sum.Topic).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if len(subs) != 0 || rows != 0 {
			t.Errorf("left behind: %d subscriptions, %d outbox rows", len(subs), rows)
		}
		return
	}
	// --keep: the database agrees with the summary. The poison is the one
	// FAILED row of the topic; the disabled subscription's deliveries are
	// all delivered.
	failed, err := outboxstore.ListFailed(ctx, db.Pool, sum.Topic, 10, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(failed) != 1 || failed[0].EventType != "asset.rendition_ready" || sum.FailedReason == "" {
		t.Errorf("FAILED rows %+v (reason %q), want the one poison rendition", failed, sum.FailedReason)
	}
	if len(subs) != 1 || subs[0].ID != sum.SubscriptionID || subs[0].Enabled {
		t.Fatalf("subscriptions %+v, want the run's, disabled", subs)
	}
	page, err := store.NewDeliveryStore(db.Pool).List(ctx, store.ListParams{SubscriptionID: sum.SubscriptionID, Status: store.StatusDelivered, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	// The fast lane keeps no delivery rows: the database holds the slow
	// lane's.
	if len(page.Deliveries) != sum.DeliveredSlowLane {
		t.Errorf("%d deliveries delivered in the database, the summary counts %d through the slow lane", len(page.Deliveries), sum.DeliveredSlowLane)
	}
}

func TestDemoEmbeddedBroker(t *testing.T) {
	db := pgtest.NewParallel(t)
	const events = 300
	sum, err := run(t, context.Background(), db, nil, demo.Options{Events: events, Assets: 12, Rate: 600, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("RunDemo: %v", err)
	}
	if !sum.EmbeddedBroker || sum.Database == "" {
		t.Errorf("embedded %v, database %q", sum.EmbeddedBroker, sum.Database)
	}
	checkClean(t, db, sum, events)
}

// TestDemoRealBroker is also the end-to-end test of the pipeline against
// Apache Kafka: relay, consume and deliver together take events from
// bridge.enqueue to a receiver with valid signatures and per-asset order.
func TestDemoRealBroker(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.RealBrokers(t)
	db := pgtest.New(t)
	const events = 300
	sum, err := run(t, context.Background(), db, brokers, demo.Options{Events: events, Assets: 12, Rate: 600, Timeout: time.Minute, Keep: true})
	if err != nil {
		t.Fatalf("RunDemo: %v", err)
	}
	t.Cleanup(func() {
		kopts := []kgo.Opt{kgo.SeedBrokers(brokers...)}
		if err := demo.RemoveTopic(context.Background(), kopts, sum.Topic, "bridge-demo-"+sum.RunID); err != nil {
			t.Logf("remove the kept topic: %v", err)
		}
	})
	if sum.EmbeddedBroker {
		t.Error("ran on the embedded broker although KAFKA_BROKERS was set")
	}
	checkClean(t, db, sum, events)
}

func TestDemoCancelledMidRunReturnsSummarySoFar(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cancelledAt atomic.Int64
	var cancelTime atomic.Int64 // unix nanoseconds
	o := demo.Options{
		Events: 5000, Assets: 50, Rate: 250, Timeout: time.Minute,
		Tick: 50 * time.Millisecond,
		OnProgress: func(p demo.Progress) {
			if p.Delivered >= 60 && cancelledAt.Load() == 0 {
				cancelledAt.Store(int64(p.Delivered))
				cancelTime.Store(time.Now().UnixNano())
				cancel()
			}
		},
	}
	start := time.Now()
	sum, err := run(t, ctx, db, nil, o)
	if err != nil {
		t.Fatalf("RunDemo after cancel: %v (a Ctrl-C is not a failure)", err)
	}
	t.Logf("summary after cancel at %d delivered, %s: %+v", cancelledAt.Load(), time.Since(start), *sum)
	if !sum.Interrupted {
		t.Error("summary not marked interrupted")
	}
	if sum.Enqueued == 0 || sum.Enqueued >= 5000 {
		t.Errorf("enqueued %d: want the part played before the cancel", sum.Enqueued)
	}
	if sum.Delivered < int(cancelledAt.Load()) {
		t.Errorf("delivered %d, but %d had arrived when it was cancelled", sum.Delivered, cancelledAt.Load())
	}
	if sum.OrderViolations != 0 || sum.SignatureFailures != 0 {
		t.Errorf("violations %d, signature failures %d", sum.OrderViolations, sum.SignatureFailures)
	}
	if err := sum.Err(); err != nil {
		t.Errorf("Err() = %v: undelivered events after a cancel are expected", err)
	}
	// The pipeline drains (the deliverer gives requests in flight up to 5s)
	// and the run cleans up; 5000 events at 250/s would have taken 20s.
	if d := time.Since(time.Unix(0, cancelTime.Load())); d > 10*time.Second {
		t.Errorf("took %s from the cancel to the summary", d)
	}
	subs, err := store.NewSubscriptionStore(db.Pool, true, 0).List(context.Background())
	if err != nil || len(subs) != 0 {
		t.Errorf("subscriptions left after a cancel: %v %+v", err, subs)
	}
}

// TestDemoLeavesOtherApplicationsEventsAlone: with another topic's NEW rows
// in the database, the demo's relay would send them to its own broker and
// mark them SENT. It runs next door instead, in "<name>_demo".
func TestDemoLeavesOtherApplicationsEventsAlone(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	var id string
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT bridge.enqueue('orders', 'order-1', 'order.placed', '{}')::text`).Scan(&id)
	})
	if err != nil {
		t.Fatal(err)
	}
	scratch := db.Name + demo.ScratchSuffix
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, pgx.Identifier{scratch}.Sanitize()))
	})

	sum, err := run(t, ctx, db, nil, demo.Options{Events: 100, Assets: 5, Rate: -1, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("RunDemo: %v", err)
	}
	if err := sum.Err(); err != nil || sum.Delivered != 99 {
		t.Errorf("Err() = %v, delivered %d", err, sum.Delivered)
	}
	var status string
	if err := db.Pool.QueryRow(ctx, `SELECT status FROM bridge.outbox WHERE id = $1`, id).Scan(&status); err != nil || status != "NEW" {
		t.Errorf("the other application's row is %q (%v), want still NEW", status, err)
	}
	var demoRows int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.outbox WHERE topic = $1`, sum.Topic).Scan(&demoRows); err != nil || demoRows != 0 {
		t.Errorf("%d demo rows in the application's database (%v), want 0", demoRows, err)
	}
	if want := "/" + scratch; !strings.Contains(sum.Database, want) {
		t.Errorf("ran in %s, want the scratch database %s", sum.Database, scratch)
	}
}

// TestDemoMovesAwayFromADatabaseFromBeforeTheBaseline: a database migrated by
// a development build from before the baseline is refused by migrate; the demo
// leaves it untouched and runs in "<name>_demo" instead — and recreates that
// one when it is itself from before the baseline (it is the demo's own).
func TestDemoMovesAwayFromADatabaseFromBeforeTheBaseline(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	preFold := func(t *testing.T, pool *pgxpool.Pool) {
		t.Helper()
		if _, err := pool.Exec(ctx, `DELETE FROM public.`+database.MigrationsTable+` WHERE version_id > 1`); err != nil {
			t.Fatal(err)
		}
		for v := 2; v <= 7; v++ {
			if _, err := pool.Exec(ctx, `INSERT INTO public.`+database.MigrationsTable+` (version_id, is_applied) VALUES ($1, true)`, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	preFold(t, db.Pool)
	scratch := db.Name + demo.ScratchSuffix
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, pgx.Identifier{scratch}.Sanitize()))
	})
	// The scratch database exists already, migrated before the baseline too.
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`CREATE DATABASE %s`, pgx.Identifier{scratch}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + scratch
	sp, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := database.Migrate(ctx, sp, nil); err != nil {
		t.Fatal(err)
	}
	preFold(t, sp)
	sp.Close()

	sum, err := run(t, ctx, db, nil, demo.Options{Events: 50, Assets: 5, Rate: -1, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("RunDemo: %v", err)
	}
	if err := sum.Err(); err != nil || sum.Delivered != 49 {
		t.Errorf("Err() = %v, delivered %d", err, sum.Delivered)
	}
	if want := "/" + scratch; !strings.Contains(sum.Database, want) {
		t.Errorf("ran in %s, want the scratch database %s", sum.Database, scratch)
	}
	if v, err := database.SchemaVersion(ctx, db.Pool); err != nil || v != 7 {
		t.Errorf("the pre-baseline database is at version %d (%v), want it left at 7", v, err)
	}
}
