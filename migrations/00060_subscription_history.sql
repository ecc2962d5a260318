-- Why this exists: a new subscription can start with history
-- (`subscriptions create --since T`). The deliverer copies the retained
-- outbox rows since T that match it into bridge.deliveries, in bounded
-- batches, before the subscription's deliveries may be claimed.
--
-- history_since: the T asked for (NULL: no history).
-- history_upto: the outbox seq bound, fixed by the first batch (the outbox
--   sequence's last value, read after the subscription committed): a row
--   above it committed after the subscription existed and reaches it live.
-- history_asset/history_asset_seq: the cursor, the last (asset, asset_seq)
--   key scanned; written with each batch, so a crashed backfill resumes.
-- history_copied: deliveries written so far; history_done_at: finished.
--
-- deliveries_history_seq numbers the copied deliveries below every seq the
-- live fan-out takes (bigserial, positive), so in each (subscription, asset)
-- stream the history goes out before anything the consumer queued while it
-- was being copied, and in asset_seq order among itself.

-- +goose Up
ALTER TABLE bridge.subscriptions
  ADD COLUMN history_since timestamptz,
  ADD COLUMN history_upto bigint,
  ADD COLUMN history_asset text,
  ADD COLUMN history_asset_seq bigint,
  ADD COLUMN history_copied bigint NOT NULL DEFAULT 0,
  ADD COLUMN history_done_at timestamptz;

CREATE INDEX subscriptions_history_pending ON bridge.subscriptions (created_at)
  WHERE history_since IS NOT NULL AND history_done_at IS NULL;

CREATE SEQUENCE bridge.deliveries_history_seq AS bigint
  MINVALUE -9223372036854775807 MAXVALUE -1 START WITH -9223372036854775807;

-- +goose Down
DROP SEQUENCE bridge.deliveries_history_seq;
DROP INDEX bridge.subscriptions_history_pending;
ALTER TABLE bridge.subscriptions
  DROP COLUMN history_since, DROP COLUMN history_upto, DROP COLUMN history_asset,
  DROP COLUMN history_asset_seq, DROP COLUMN history_copied, DROP COLUMN history_done_at;
