package store

import (
	"context"
	"fmt"

	"github.com/outboxbridge/bridge/internal/database/statement"
)

// Two reads for the console's search and its "recover since" confirmation
// (internal/console); nothing here writes.

// byEventSQL finds an event's deliveries (event_id is the outbox row id,
// sent as webhook-id) through deliveries_once_per_subscription: one probe
// per subscription, since the index leads with subscription_id.
const byEventSQL = `
SELECT ` + deliveryColumns + `
FROM bridge.subscriptions s
JOIN LATERAL (SELECT * FROM bridge.deliveries x WHERE x.subscription_id = s.id AND x.event_id = $1) d ON true
ORDER BY d.id
LIMIT 100`

// countDeadWindowSQL counts what recoverWindowSQL would revive.
const countDeadWindowSQL = `
SELECT count(*) FROM bridge.deliveries
WHERE subscription_id = $1 AND status = 'dead' AND created_at >= $2
  AND ($3::timestamptz IS NULL OR created_at < $3::timestamptz)`

// ByEvent returns the deliveries of one event (at most 100: one per
// subscription), oldest first.
func (s *DeliveryStore) ByEvent(ctx context.Context, eventID string) ([]Delivery, error) {
	return statement.Select[Delivery](ctx, s.db, "find deliveries of an event", byEventSQL, eventID)
}

// CountDeadWindow counts the dead deliveries RecoverWindow would revive now.
func (s *DeliveryStore) CountDeadWindow(ctx context.Context, subscriptionID string, w Window) (int64, error) {
	id, err := ParseID(subscriptionID)
	if err != nil {
		return 0, err
	}
	var n int64
	if err := s.db.QueryRow(ctx, countDeadWindowSQL, id, w.Since, w.Until).Scan(&n); err != nil {
		return 0, fmt.Errorf("count dead deliveries: %w", err)
	}
	return n, nil
}
