package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestClaimPlanMadeOnEmptyTablesStaysCheap: the claim runs with its generic
// plan, made once per connection at its first claim. On a new database that
// is a plan for empty tables, kept while the backlog grows — and planned
// for empty tables the claim scanned every pending row of a subscription
// (with a nested loop over the rows picked, or sequential scans), so each
// claim cost O(backlog) and a deliverer that fell behind fell further
// behind (bench pipeline: ~1 s claims, p99 33 s). The claim's transaction
// settings (claimLockSQL) and the LATERAL lock make the plan index probes
// per stream whatever the statistics said. The test makes the generic plan
// on analyzed empty tables, adds 30,000 pending rows, and counts the rows
// the kept plan handles for one claim of 64: the batch's few hundred, not
// the backlog.
func TestClaimPlanMadeOnEmptyTablesStaysCheap(t *testing.T) {
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
	if _, err := conn.Exec(ctx, `ANALYZE bridge.deliveries; ANALYZE bridge.delivery_streams; ANALYZE bridge.subscriptions`); err != nil {
		t.Fatal(err)
	}
	// One row each, as a warm-up event leaves them.
	for _, s := range subs {
		b.insert(t, s, "warm-up", 0, `{}`)
	}
	if _, err := conn.Exec(ctx, `PREPARE claim_plan_test AS `+claimSQL); err != nil {
		t.Fatal(err)
	}
	// EXECUTE takes no bind parameters: literals. The subscriptions come
	// as claimSubscriptionsSQL passes them (claimSettingsSQL).
	execute := `EXECUTE claim_plan_test('plan-test', 32, 64, '1 minute', 9223372036854775807, '{}', '{}')`
	run := func(sql string, f func(pgx.Rows) error) {
		t.Helper()
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, claimLockSQL); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, claimSettingsSQL(subs)); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, sql)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				if err := f(rows); err != nil {
					return err
				}
			}
			if err := rows.Err(); err != nil {
				return err
			}
			return errRollback
		})
		if err != nil && !errors.Is(err, errRollback) {
			t.Fatal(err)
		}
	}
	// The first execution makes and keeps the generic plan (rolled back:
	// nothing claimed).
	run(execute, func(pgx.Rows) error { return nil })

	if _, err := conn.Exec(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at)
SELECT s, 'e-' || g || '-' || s, 't', 'bench', 'asset-' || (g % 1000), g / 1000, '{"pad": "xxxxxxxxxxxxxxxx"}', now()
FROM unnest($1::uuid[]) s, generate_series(0, 9999) g ORDER BY g, s`, subs); err != nil {
		t.Fatal(err)
	}

	var plan []struct {
		Plan planNode `json:"Plan"`
	}
	run(`EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) `+execute, func(rows pgx.Rows) error {
		var raw []byte
		if err := rows.Scan(&raw); err != nil {
			return err
		}
		return json.Unmarshal(raw, &plan)
	})
	if len(plan) != 1 {
		t.Fatalf("EXPLAIN returned %d plans", len(plan))
	}
	handled := plan[0].Plan.handled()
	t.Logf("rows handled by the kept plan for one claim over 30,000 pending rows: %.0f", handled)
	if handled > 5000 {
		t.Fatalf("the claim's generic plan, made on empty tables, handled %.0f rows for one claim of 64 over a 30,000-row backlog: it walks the backlog", handled)
	}
}

// planNode is a node of EXPLAIN (FORMAT JSON): how many rows it produced,
// how often it ran, what it filtered out, and its children.
type planNode struct {
	Rows       float64    `json:"Actual Rows"`
	Loops      float64    `json:"Actual Loops"`
	Filtered   float64    `json:"Rows Removed by Filter"`
	JoinFilter float64    `json:"Rows Removed by Join Filter"`
	Plans      []planNode `json:"Plans"`
}

// handled sums, over the tree, the rows each node produced and threw away
// (EXPLAIN gives both per loop).
func (n planNode) handled() float64 {
	total := (n.Rows + n.Filtered + n.JoinFilter) * math.Max(n.Loops, 1)
	for _, c := range n.Plans {
		total += c.handled()
	}
	return total
}

// claimSettingsSQL passes subs to claimSQL in the current transaction as
// claimSubscriptionsSQL does (no rate-limited subscriptions).
func claimSettingsSQL(subs []string) string {
	return fmt.Sprintf(`SELECT set_config('bridge.claim_subscriptions', '{%s}', true),
       set_config('bridge.claim_rated', '{}', true), set_config('bridge.claim_tokens', '{}', true)`, strings.Join(subs, ","))
}

// errRollback ends a pgx.BeginFunc transaction with a rollback.
var errRollback = errors.New("rollback")
