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

// pruneIdleStreamsSQL deletes up to $1 idle streams: parked at 'infinity'
// (the claim found no open row) with no open delivery. It must never delete
// the row of a stream that is getting a delivery at the same time — that
// delivery would have no stream row and never be claimed:
//   - the inserting transaction's trigger holds the stream row from its
//     upsert until commit, so SKIP LOCKED passes it by;
//   - a stream row changed after this statement's snapshot (an insert or a
//     revive committed meanwhile) is re-checked when locked, and its
//     ready_at is no longer 'infinity' (the outer condition and the
//     subquery's, under PostgreSQL's re-check of locked rows);
//   - if this statement deletes first, the insert's upsert waits for it and
//     then inserts a fresh row, ready.
//
// Delivered and dead rows do not keep a stream: a revive re-creates it.
// The batch is a MATERIALIZED CTE so its LIMIT holds (an IN (subquery)
// can be re-run per outer row and delete more than the batch).
//
// Parked streams are found per subscription, as the range (subscription_id,
// 'infinity') of delivery_streams_ready: the index of parked streams that
// did this (dropped by migration 00140) took an entry at every park, i.e.
// at nearly every delivery, for a statement that runs once a minute.
const pruneIdleStreamsSQL = `
WITH idle AS MATERIALIZED (
  SELECT i.subscription_id, i.asset_key
  FROM bridge.subscriptions s
  CROSS JOIN LATERAL (
    SELECT x.subscription_id, x.asset_key FROM bridge.delivery_streams x
    WHERE x.subscription_id = s.id AND x.ready_at = 'infinity'
      AND NOT EXISTS (SELECT 1 FROM bridge.deliveries d
                      WHERE d.subscription_id = x.subscription_id
                        AND coalesce(d.asset_id, '') = x.asset_key
                        AND d.status IN ('pending', 'delivering'))
    LIMIT $1
    FOR UPDATE OF x SKIP LOCKED
  ) i
  LIMIT $1
)
DELETE FROM bridge.delivery_streams st
USING idle
WHERE st.subscription_id = idle.subscription_id AND st.asset_key = idle.asset_key
  AND st.ready_at = 'infinity'`

// PruneIdleStreams deletes up to limit idle streams and reports how many.
func (s *DeliveryStore) PruneIdleStreams(ctx context.Context, limit int) (int, error) {
	tag, err := s.db.Exec(ctx, pruneIdleStreamsSQL, limit)
	if err != nil {
		return 0, fmt.Errorf("prune idle delivery streams: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
