package outboxstore

import (
	"context"
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
// not scanned on every refresh.
func TestGaugeStatsCountAsTheOperatorsReadWithoutScanningThePassedLog(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO bridge.outbox_log (tbl, id, asset_seq, topic, asset_id, lane, event_type, payload)
SELECT 0, bridge.outbox_log_id(0), 1, 't', 'passed-' || g, bridge.lane_of('passed-' || g), 'e', '{}'
FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	passAll(t, ctx, db)
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
	if _, err := db.Pool.Exec(ctx, `ANALYZE bridge.outbox_log`); err != nil {
		t.Fatal(err)
	}

	exact, err := ReadStats(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if exact.ByStatus["NEW"] != 2 || exact.ByStatus["SENT"] != 19999 || exact.ByStatus["FAILED"] != 2 || exact.OldestNewAgeSeconds <= 0 {
		t.Fatalf("operator's read: %+v, want NEW 2, SENT 19999, FAILED 2 and a positive age", exact)
	}
	testkit.Eventually(t, 30*time.Second, func() string {
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

	var plan []map[string]any
	if err := db.Pool.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+gaugeNewSQL).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	rows := 0.0
	planNodes(plan[0]["Plan"].(map[string]any), func(n map[string]any) {
		if rel, _ := n["Relation Name"].(string); strings.HasPrefix(rel, "outbox_log_") {
			removed, _ := n["Rows Removed by Filter"].(float64)
			rows += n["Actual Rows"].(float64) + removed
		}
	})
	if rows > 100 {
		t.Fatalf("counting 2 NEW rows read %v rows of the log: it scanned the 20,000 every lane passed", rows)
	}
}
