-- Why this exists: bridge.delivery_streams kept one row per (subscription,
-- asset) stream that ever had a delivery, forever, so the table (and the
-- claim's index on it) grew with every asset ever seen. The deliverer now
-- deletes idle streams — parked at 'infinity' with no open delivery — in
-- bounded batches; this index finds them without walking the streams that
-- are in use. A stream that gets a delivery again is re-created by the
-- insert trigger, as on its first delivery.

-- +goose Up
CREATE INDEX delivery_streams_idle ON bridge.delivery_streams (subscription_id, asset_key)
  WHERE ready_at = 'infinity';

-- +goose Down
DROP INDEX bridge.delivery_streams_idle;
