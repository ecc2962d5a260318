package store

import (
	"context"
	"fmt"
	"time"
)

// pruneDeliveredSQL deletes up to $2 delivered deliveries older than $1
// (their attempts go by ON DELETE CASCADE). SKIP LOCKED: replicas pruning at
// once take different rows. Dead ones are kept for revive.
const pruneDeliveredSQL = `
DELETE FROM bridge.deliveries
WHERE id IN (
  SELECT id FROM bridge.deliveries
  WHERE status = 'delivered' AND delivered_at < now() - $1::interval
  ORDER BY delivered_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED)`

// PruneDelivered deletes up to limit delivered deliveries older than
// retention, with their attempt log, and reports how many.
func (s *DeliveryStore) PruneDelivered(ctx context.Context, retention time.Duration, limit int) (int, error) {
	tag, err := s.db.Exec(ctx, pruneDeliveredSQL, retention, limit)
	if err != nil {
		return 0, fmt.Errorf("prune delivered deliveries: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
