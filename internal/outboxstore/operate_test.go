package outboxstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// The metrics' read of the outbox counts what the operator's read counts —
// NEW, FAILED and the oldest NEW row's age exactly, SENT once PostgreSQL's
// statistics caught up — and reads only the log past the lanes' positions:
// the rows every lane passed (tens of millions over RELAY_RETENTION) are
// not scanned on every refresh, also when a transaction held the
// snapshots' xmin back.
func TestGaugeStatsCountAsTheOperatorsReadWithoutScanningThePassedLog(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	// A transaction that enqueues an event and is still open when the lanes'
	// positions are taken (in their ticks' xmin and in progress there), and
	// commits after: its event is NEW, and until then every snapshot's xmin
	// stays below the rows written after it began.
	other, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	enqueueOne(t, ctx, other, "B")
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO bridge.outbox_log (tbl, id, asset_seq, topic, asset_id, lane, event_type, payload)
SELECT 0, bridge.outbox_log_id(0), 1, 't', 'passed-' || g, bridge.lane_of('passed-' || g), 'e', '{}'
FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	passAll(t, ctx, db)
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		commitOne(t, ctx, db, "A")
	}
	// One of the passed rows and one of the new ones parked, a new one held
	// NEW behind it (as the relay holds an asset behind a failing row).
	if _, err := db.Pool.Exec(ctx, `
UPDATE bridge.outbox SET status = 'FAILED', failed_at = now()
WHERE id IN ((SELECT id FROM bridge.outbox WHERE asset_id = 'passed-7'),
             (SELECT id FROM bridge.outbox WHERE asset_id = 'A' AND asset_seq = 1))`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.outbox SET attempts = 1 WHERE asset_id = 'A' AND asset_seq = 2`); err != nil {
		t.Fatal(err)
	}
	// Statistics for the planner, once every writer's counts reached
	// PostgreSQL's statistics: an ANALYZE sets the live-row count, and a
	// writer's count sent after it would be added twice.
	testkit.Eventually(t, 60*time.Second, func() string {
		var live int64
		if err := db.Pool.QueryRow(ctx, gaugeLogRowsSQL).Scan(&live); err != nil {
			return err.Error()
		}
		if live != 20004 {
			return fmt.Sprintf("the log's live rows in pg_stat_user_tables: %d, want the 20,004 written", live)
		}
		return ""
	})
	if _, err := db.Pool.Exec(ctx, `ANALYZE bridge.outbox_log`); err != nil {
		t.Fatal(err)
	}

	exact, err := ReadStats(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if exact.ByStatus["NEW"] != 3 || exact.ByStatus["SENT"] != 19999 || exact.ByStatus["FAILED"] != 2 || exact.OldestNewAgeSeconds <= 0 {
		t.Fatalf("operator's read: %+v, want NEW 3 (B, A2, A3), SENT 19999, FAILED 2 and a positive age", exact)
	}
	testkit.Eventually(t, 60*time.Second, func() string {
		got, err := ReadGaugeStats(ctx, db.Pool)
		if err != nil {
			return err.Error()
		}
		if fmt.Sprint(got.ByStatus) != fmt.Sprint(exact.ByStatus) || fmt.Sprint(got.FailedByTopic) != fmt.Sprint(exact.FailedByTopic) ||
			got.OldestNewAgeSeconds < exact.OldestNewAgeSeconds {
			return fmt.Sprintf("gauges read %+v, the operator's read %+v", got, exact)
		}
		return ""
	})

	var bound string
	if err := db.Pool.QueryRow(ctx, gaugeBoundSQL).Scan(&bound); err != nil {
		t.Fatal(err)
	}
	var plan []map[string]any
	if err := db.Pool.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+gaugeNewSQL, bound).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if testing.Verbose() {
		b, _ := json.MarshalIndent(plan, "", " ")
		t.Log(string(b))
	}
	rows := 0.0
	planNodes(plan[0]["Plan"].(map[string]any), func(n map[string]any) {
		if rel, _ := n["Relation Name"].(string); strings.HasPrefix(rel, "outbox_log_") {
			removed, _ := n["Rows Removed by Filter"].(float64)
			rows += n["Actual Rows"].(float64) + removed
		}
	})
	if rows > 100 {
		t.Fatalf("counting 3 NEW rows read %v rows of the log: it scanned the 20,000 every lane passed", rows)
	}
}
