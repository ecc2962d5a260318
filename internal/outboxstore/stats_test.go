package outboxstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// Replicas whose claims meet the same backlog find the same stale statistics
// at once; if each ANALYZEd bridge.outbox, three ANALYZEs (and three
// replans of every cached claim) in one drain would make three replicas
// slower than one. A relay that finds another one analyzing waits for it and then finds
// the statistics fresh; it analyzes only statistics that are still stale.
func TestAnalyzeOutboxIfStaleLeavesAnAnalyzeInProgressToItsRelay(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, `ANALYZE bridge.outbox`); err != nil {
		t.Fatal(err)
	}
	analyzes := func() (n int64) {
		t.Helper()
		if err := db.Pool.QueryRow(ctx, `SELECT analyze_count FROM pg_stat_user_tables WHERE relid = 'bridge.outbox'::regclass`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	burst(t, db.Pool, 20000)

	// Another relay holds the lock and analyzes.
	other, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	for _, sql := range []string{analyzeLockSQL, `ANALYZE bridge.outbox`} {
		if _, err := other.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	before := analyzes()
	type outcome struct {
		analyzed bool
		err      error
	}
	done := make(chan outcome, 1)
	go func() {
		analyzed, err := AnalyzeOutboxIfStale(ctx, db.Pool)
		done <- outcome{analyzed, err}
	}()
	testkit.Eventually(t, 10*time.Second, func() string {
		var waiting bool
		if err := db.Pool.QueryRow(ctx, `
SELECT EXISTS (SELECT 1 FROM pg_locks
               WHERE locktype = 'advisory' AND NOT granted
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                 AND classid = x'6F410000'::int::oid AND objid = 4 AND objsubid = 2)`).Scan(&waiting); err != nil {
			return err.Error()
		}
		return testkit.Unless(waiting, "the second relay waits for the first one's analyze")
	})
	select {
	case o := <-done:
		t.Fatalf("AnalyzeOutboxIfStale returned (%v, %v) while another relay was analyzing; want it to wait", o.analyzed, o.err)
	default:
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if o := <-done; o.err != nil || o.analyzed {
		t.Fatalf("after the other relay's analyze: analyzed %v, %v; want the statistics found fresh and no second ANALYZE", o.analyzed, o.err)
	}
	if n := analyzes(); n != before {
		t.Fatalf("analyze_count went from %d to %d; want the other relay's ANALYZE only", before, n)
	}

	// Statistics that are stale again are analyzed.
	burst(t, db.Pool, 40000)
	if analyzed, err := AnalyzeOutboxIfStale(ctx, db.Pool); err != nil || !analyzed {
		t.Fatalf("stale statistics and nobody analyzing: analyzed %v, %v; want an ANALYZE", analyzed, err)
	}
	if n := analyzes(); n != before+1 {
		t.Fatalf("analyze_count went from %d to %d; want one more", before, n)
	}
}

// burst writes n NEW rows and waits until the cumulative statistics count
// them: the writer's change counts reach the cumulative statistics when its backend
// flushes them (up to 10 s later unless forced), and counts that arrive
// after an ANALYZE would make the statistics stale again.
func burst(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	ctx := t.Context()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := BenchFill(ctx, conn, n, "t", 200, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, func() string {
		var changed int64
		if err := pool.QueryRow(ctx, `SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relid = 'bridge.outbox'::regclass`).Scan(&changed); err != nil {
			return err.Error()
		}
		return testkit.Unless(changed >= int64(n), "the burst of %d rows counted in the statistics (n_mod_since_analyze %d)", n, changed)
	})
}
