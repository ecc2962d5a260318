package store

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestClaimLockProbeIgnoresStalePartialIndexStatistics: a partial index's
// statistics move only when the table is vacuumed or analyzed. Vacuumed
// while every row was delivered (retention keeps them), the open-rows
// indexes say they hold nothing, and a backlog inserted since does not
// change that. The claim's lock step, planned so, read a whole partial
// index for every row picked — one whose predicate status = 'pending'
// implies, since an index that holds "nothing" costs nothing to read —
// instead of one primary-key probe: 15 s per claim over 100,000 pending
// behind 1,000,000 delivered (`bench deliver --delivered 1000000`).
//
// The test vacuums a table of 90,000 delivered rows, queues 60,000 pending
// ones and counts the buffers one claim of 64 reads with the plan made
// then: ~2,600 for the probes (the batch's streams, heads and rows), 38,000
// with an index read in full per row picked. (Buffers, not rows: an index
// scan whose Index Cond skips the index's first column reads it all and
// shows no rows removed.) Cost: ~5 s, most of it the inserts.

func TestClaimLockProbeIgnoresStalePartialIndexStatistics(t *testing.T) {
	b, ctx := setup(t)
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var subs []string
	for range 3 {
		subs = append(subs, b.createSub(t, "https://a.example/hook").ID)
	}
	insert := func(status string, n int) {
		t.Helper()
		if _, err := conn.Exec(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at, status)
SELECT s, $2 || '-' || g || '-' || s, 't', 'bench', 'asset-' || (g % 1000), g / 1000, '{"pad": "xxxxxxxxxxxxxxxx"}', now(), $2
FROM unnest($1::uuid[]) s, generate_series(0, $3 - 1) g ORDER BY g, s`, subs, status, n); err != nil {
			t.Fatal(err)
		}
	}
	insert(StatusDelivered, 30000)
	if _, err := conn.Exec(ctx, `VACUUM ANALYZE bridge.deliveries`); err != nil {
		t.Fatal(err)
	}
	insert(StatusPending, 20000)

	var plan []struct {
		Plan struct {
			Hit  float64 `json:"Shared Hit Blocks"`
			Read float64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, claimLockSQL); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, claimSettingsSQL(subs)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `PREPARE claim_stale_test AS `+claimSQL); err != nil {
			return err
		}
		var raw []byte
		if err := tx.QueryRow(ctx, fmt.Sprintf(`EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) EXECUTE claim_stale_test('plan-test', 32, 64, '1 minute', 9223372036854775807, '{}', '{}')`)).Scan(&raw); err != nil {
			return err
		}
		if err := json.Unmarshal(raw, &plan); err != nil {
			return err
		}
		return errRollback
	})
	if err != errRollback {
		t.Fatal(err)
	}
	if len(plan) != 1 {
		t.Fatalf("EXPLAIN returned %d plans", len(plan))
	}
	buffers := plan[0].Plan.Hit + plan[0].Plan.Read
	t.Logf("buffers read by one claim over 60,000 pending rows, planned on stale partial-index statistics: %.0f", buffers)
	if buffers > 6000 {
		t.Fatalf("one claim of 64 over a 60,000-row backlog read %.0f buffers: planned on the stale statistics of a partial index, it reads an index in full per row", buffers)
	}
}
