-- Why this exists: the insert trigger of migration 00005 upserted a batch's
-- streams in whatever order GROUP BY produced. Two transactions inserting
-- deliveries for the same streams in different orders (two consumers, or a
-- consumer and a revive) could deadlock on the stream rows. Every writer of
-- several stream rows now takes them in (subscription_id, asset_key) order.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION bridge.delivery_streams_on_insert() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO bridge.delivery_streams AS st (subscription_id, asset_key, ready_at)
  SELECT n.subscription_id, coalesce(n.asset_id, ''), min(n.next_attempt_at)
  FROM new_rows n
  WHERE n.status IN ('pending', 'delivering')
  GROUP BY 1, 2
  ORDER BY 1, 2
  ON CONFLICT (subscription_id, asset_key) DO UPDATE
    SET ready_at = least(st.ready_at, excluded.ready_at), gen = st.gen + 1;
  RETURN NULL;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION bridge.delivery_streams_on_insert() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO bridge.delivery_streams AS st (subscription_id, asset_key, ready_at)
  SELECT n.subscription_id, coalesce(n.asset_id, ''), min(n.next_attempt_at)
  FROM new_rows n
  WHERE n.status IN ('pending', 'delivering')
  GROUP BY 1, 2
  ON CONFLICT (subscription_id, asset_key) DO UPDATE
    SET ready_at = least(st.ready_at, excluded.ready_at), gen = st.gen + 1;
  RETURN NULL;
END
$fn$;
-- +goose StatementEnd
