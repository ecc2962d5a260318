package store

import (
	"context"
	"fmt"
)

// insertRetainedSQL adds $5 deliveries that are already delivered, one
// attempt logged each, spread over the subscriptions $1 and $3 assets each:
// what WEBHOOK_RETENTION keeps behind a deliverer that has been running for
// a while (900,000 rows after 5 minutes of `bench pipeline`). They are
// never claimed; `bench deliver --delivered N` puts them in front of its
// backlog to show what their presence costs the claims and outcomes.
const insertRetainedSQL = `
WITH d AS (
  INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload,
                                 event_created_at, status, attempts, delivered_at, last_status_code)
  SELECT x.s[1 + g % cardinality(x.s)], 'retained-' || g, 'bench.event', 'bench',
         'asset-' || (g / cardinality(x.s)) % $3, g / cardinality(x.s) / $3 + 1, $4::jsonb,
         now(), 'delivered', 1, now(), 204
  FROM (SELECT $1::uuid[] AS s) x, generate_series($2::bigint, $2::bigint + $5 - 1) g
  RETURNING id
)
INSERT INTO bridge.delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code)
SELECT id, 1, now(), 1, 204 FROM d`

// InsertRetained adds n delivered deliveries (with their attempt) over the
// subscriptions, in statements of at most 50,000 rows, with payload as each
// one's payload.
func InsertRetained(ctx context.Context, db DB, subscriptionIDs []string, assets, n int, payload string) error {
	const batch = 50_000
	for from := 0; from < n; from += batch {
		if _, err := db.Exec(ctx, insertRetainedSQL, subscriptionIDs, from, assets, payload, min(batch, n-from)); err != nil {
			return fmt.Errorf("insert retained deliveries: %w", err)
		}
	}
	return nil
}
