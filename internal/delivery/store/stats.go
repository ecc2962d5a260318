package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The counts the metrics gauges and the demo summary read.

// deliveriesByStatusSQL counts deliveries by status. It reads the whole
// table (delivered rows included), which is why the gauges run it at most
// once per refresh interval rather than per scrape.
const deliveriesByStatusSQL = `
SELECT status, count(*) FROM bridge.deliveries GROUP BY status`

// subscriptionsByStateSQL counts enabled and disabled subscriptions.
const subscriptionsByStateSQL = `
SELECT count(*) FILTER (WHERE enabled), count(*) FILTER (WHERE NOT enabled) FROM bridge.subscriptions`

// oldestOpenDeliverySQL returns, per subscription, the age in seconds of its
// oldest delivery not yet delivered or dead (pending or delivering; NULL when
// none): how far that endpoint's webhooks are behind. One index probe per
// subscription on deliveries_waiting_by_subscription for the pending ones
// (ids are handed out in insert order) and a walk of its few in-flight rows
// on deliveries_in_flight_by_stream (migration 00120), so the cost follows
// the number of subscriptions, not the backlog.
const oldestOpenDeliverySQL = `
SELECT s.id::text, extract(epoch FROM now() - least(p.created_at, d.created_at))::float8
FROM bridge.subscriptions s
LEFT JOIN LATERAL (
  SELECT x.created_at FROM bridge.deliveries x
  WHERE x.subscription_id = s.id AND x.status = 'pending' ORDER BY x.id LIMIT 1
) p ON true
LEFT JOIN LATERAL (
  SELECT x.created_at FROM bridge.deliveries x
  WHERE x.subscription_id = s.id AND x.status = 'delivering' ORDER BY x.id LIMIT 1
) d ON true
WHERE s.enabled OR p.created_at IS NOT NULL OR d.created_at IS NOT NULL`

// subscriptionOutcomesSQL: one subscription's deliveries by final state.
const subscriptionOutcomesSQL = `
SELECT count(*) FILTER (WHERE status = 'delivered'),
       count(*) FILTER (WHERE status = 'dead')
  FROM bridge.deliveries
 WHERE subscription_id = $1`

// notDeliveredSQL counts deliveries that are not delivered (yet), of the
// subscriptions in $1 (NULL: all).
const notDeliveredSQL = `
SELECT count(*) FROM bridge.deliveries
WHERE status <> 'delivered' AND ($1::uuid[] IS NULL OR subscription_id = ANY($1))`

// CountByStatus returns the number of deliveries per status.
func CountByStatus(ctx context.Context, db DB) (map[string]int64, error) {
	rows, err := db.Query(ctx, deliveriesByStatusSQL)
	if err != nil {
		return nil, fmt.Errorf("count deliveries: %w", err)
	}
	out := map[string]int64{}
	var status string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&status, &n}, func() error { out[status] = n; return nil })
	if err != nil {
		return nil, fmt.Errorf("count deliveries: %w", err)
	}
	return out, nil
}

// CountSubscriptions returns how many subscriptions are enabled and disabled.
func CountSubscriptions(ctx context.Context, db DB) (enabled, disabled int64, err error) {
	if err := db.QueryRow(ctx, subscriptionsByStateSQL).Scan(&enabled, &disabled); err != nil {
		return 0, 0, fmt.Errorf("count subscriptions: %w", err)
	}
	return enabled, disabled, nil
}

// OldestOpen returns, per subscription, the age in seconds of its oldest
// open delivery; nil when it has none.
func OldestOpen(ctx context.Context, db DB) (map[string]*float64, error) {
	rows, err := db.Query(ctx, oldestOpenDeliverySQL)
	if err != nil {
		return nil, fmt.Errorf("read oldest open deliveries: %w", err)
	}
	out := map[string]*float64{}
	var id string
	var age *float64
	_, err = pgx.ForEachRow(rows, []any{&id, &age}, func() error { out[id] = age; return nil })
	if err != nil {
		return nil, fmt.Errorf("read oldest open deliveries: %w", err)
	}
	return out, nil
}

// SubscriptionOutcomes counts one subscription's delivered and dead deliveries.
func SubscriptionOutcomes(ctx context.Context, db DB, subscriptionID string) (delivered, dead int64, err error) {
	if err := db.QueryRow(ctx, subscriptionOutcomesSQL, subscriptionID).Scan(&delivered, &dead); err != nil {
		return 0, 0, fmt.Errorf("count deliveries: %w", err)
	}
	return delivered, dead, nil
}

// NotDelivered counts deliveries of any status but delivered, of the given
// subscriptions (nil: all).
func NotDelivered(ctx context.Context, db DB, subscriptionIDs []string) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, notDeliveredSQL, subscriptionIDs).Scan(&n); err != nil {
		return 0, fmt.Errorf("count undelivered: %w", err)
	}
	return n, nil
}
