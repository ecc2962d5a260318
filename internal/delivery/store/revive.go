package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/outboxbridge/bridge/internal/database/statement"
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
SELECT r.id, d.id IS NOT NULL, x.status
FROM (SELECT DISTINCT unnest($1::bigint[]) AS id) r
LEFT JOIN d ON d.id = r.id
LEFT JOIN bridge.deliveries x ON x.id = r.id
ORDER BY d.seq NULLS LAST, r.id`

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

// NotRevived is a delivery id Revive left alone, and why ("no such
// delivery", "is pending, not dead").
type NotRevived = statement.LeftAlone[int64]

// Revive puts dead deliveries back to pending with attempts reset and
// returns them in seq order. Every other id is reported with the reason it
// was left alone (it does not exist, or is not dead): a 200 listing only
// the revived ids left the caller to work out what became of the rest.
// (The reason is read in the statement's snapshot, before the update.)
func (s *DeliveryStore) Revive(ctx context.Context, ids []int64) (revived []int64, notRevived []NotRevived, err error) {
	var a statement.Acted[int64]
	err = s.revive(ctx, reviveSQL, []any{ids}, func(rows pgx.Rows) error { return a.Scan(rows, "delivery", "dead") })
	return a.Done, a.Left, err
}

// ReviveSubscription revives every dead delivery of a subscription.
func (s *DeliveryStore) ReviveSubscription(ctx context.Context, subscriptionID string) ([]int64, error) {
	id, err := ParseID(subscriptionID)
	if err != nil {
		return nil, err
	}
	var out []int64
	err = s.revive(ctx, reviveSubscriptionSQL, []any{id}, func(rows pgx.Rows) error {
		var v int64
		err := rows.Scan(&v)
		out = append(out, v)
		return err
	})
	return out, err
}

func (s *DeliveryStore) revive(ctx context.Context, sql string, args []any, scan func(pgx.Rows) error) error {
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		// Exclusive against claims: see Claim.
		if _, err := tx.Exec(ctx, reviveLockSQL); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	if err != nil {
		return fmt.Errorf("revive deliveries: %w", err)
	}
	return nil
}
