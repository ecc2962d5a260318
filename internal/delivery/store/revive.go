package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Revive: dead deliveries back to pending, over bridge.deliveries and
// bridge.delivery_streams.

// reviveSQL: dead → pending with attempts reset (the operator has just fixed
// the endpoint; one attempt left would make the button useless). Revived rows
// keep their seq, so they go out in their original order.
const reviveSQL = `
WITH d AS (
  UPDATE bridge.deliveries
  SET status = 'pending', attempts = 0, next_attempt_at = now(), revived_at = now(), last_error = NULL
  WHERE id = ANY($1::bigint[]) AND status = 'dead'
  RETURNING id, seq, subscription_id, coalesce(asset_id, '') AS asset_key
),
st AS (
  INSERT INTO bridge.delivery_streams AS st (subscription_id, asset_key, ready_at)
  SELECT DISTINCT subscription_id, asset_key, now() FROM d ORDER BY 1, 2
  ON CONFLICT (subscription_id, asset_key) DO UPDATE SET ready_at = now(), gen = st.gen + 1
)
SELECT id FROM d ORDER BY seq`

const reviveSubscriptionSQL = `
WITH d AS (
  UPDATE bridge.deliveries
  SET status = 'pending', attempts = 0, next_attempt_at = now(), revived_at = now(), last_error = NULL
  WHERE subscription_id = $1 AND status = 'dead'
  RETURNING id, seq, subscription_id, coalesce(asset_id, '') AS asset_key
),
st AS (
  INSERT INTO bridge.delivery_streams AS st (subscription_id, asset_key, ready_at)
  SELECT DISTINCT subscription_id, asset_key, now() FROM d ORDER BY 1, 2
  ON CONFLICT (subscription_id, asset_key) DO UPDATE SET ready_at = now(), gen = st.gen + 1
)
SELECT id FROM d ORDER BY seq`

// Revive puts dead deliveries back to pending with attempts reset. Ids that
// are not dead are left alone; the answer lists the revived ones.
func (s *DeliveryStore) Revive(ctx context.Context, ids []int64) ([]int64, error) {
	return s.revive(ctx, reviveSQL, ids)
}

// ReviveSubscription revives every dead delivery of a subscription.
func (s *DeliveryStore) ReviveSubscription(ctx context.Context, subscriptionID string) ([]int64, error) {
	id, err := ParseID(subscriptionID)
	if err != nil {
		return nil, err
	}
	return s.revive(ctx, reviveSubscriptionSQL, id)
}

func (s *DeliveryStore) revive(ctx context.Context, sql string, arg any) ([]int64, error) {
	var out []int64
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		// Exclusive against claims: see Claim.
		if _, err := tx.Exec(ctx, reviveLockSQL); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, sql, arg)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("revive deliveries: %w", err)
	}
	return out, nil
}
