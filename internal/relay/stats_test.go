package relay

import (
	"context"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/outboxstore"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// A burst into a table whose statistics say it is empty (analyzed while
// idle) got claims of ~200 ms at 100,000 NEW rows — a bitmap scan and sort of
// the whole backlog instead of an index walk that stops at the batch — until
// autovacuum's next round, up to a minute later. The relay ANALYZEs the
// outbox itself when a backlog meets statistics that no longer describe the
// table. analyze_count counts manual ANALYZEs only, so autovacuum cannot make
// this pass.
func TestBurstIntoTableAnalyzedEmptyRefreshesStatistics(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Fake(t)
	b := setup(t, cluster.ListenAddrs())
	ctx := context.Background()
	analyzes := func() (n int64) {
		t.Helper()
		if err := b.db.Pool.QueryRow(ctx, `SELECT analyze_count FROM pg_stat_user_tables WHERE relid = 'bridge.outbox'::regclass`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if _, err := b.db.Pool.Exec(ctx, `ANALYZE bridge.outbox`); err != nil {
		t.Fatal(err)
	}
	before := analyzes()
	topic := kafkatest.CreateTopic(t, cluster.ListenAddrs(), 6, nil)
	const rows = 20000
	if err := outboxstore.BenchFill(ctx, b.db.Pool, rows, topic, 200, 100); err != nil {
		t.Fatal(err)
	}
	if st, err := outboxstore.ReadOutboxStats(ctx, b.db.Pool); err != nil || !st.Stale || !st.CanAnalyze {
		t.Fatalf("statistics after the burst: %+v, %v; want stale and analyzable", st, err)
	}
	b.startRelay(fastConfig())
	b.waitAllSent(rows, time.Minute)
	testkit.Eventually(t, 10*time.Second, func() string {
		n := analyzes()
		return testkit.Unless(n > before, "the relay analyzed bridge.outbox (manual analyzes %d, before the burst %d)", n, before)
	})
	// Not "not stale": the fill's change counts may reach the cumulative
	// statistics only after the relay's ANALYZE, and then say stale again
	// (one more ANALYZE, 10 s later at the earliest). What matters is what
	// the planner now believes.
	if st, err := outboxstore.ReadOutboxStats(ctx, b.db.Pool); err != nil || st.Rows < rows/2 {
		t.Fatalf("statistics after the relay's analyze: %+v, %v; want them describing ~%d rows", st, err, rows)
	}
}
