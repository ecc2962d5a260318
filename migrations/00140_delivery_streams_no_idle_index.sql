-- Why this exists: delivery_streams_idle (migration 00021) indexed the
-- streams parked at 'infinity', for the idle-stream prune that runs once a
-- minute. Since a success that empties its stream parks it at once, nearly
-- every delivery parks its stream and the next insert wakes it: one more
-- entry in this index per delivery, and one more dead one, for a statement
-- that runs once a minute. The prune now finds parked streams through
-- delivery_streams_ready instead — (subscription_id, ready_at = 'infinity')
-- is the end of each subscription's range there — one range per
-- subscription, as cheap as this index was.

-- +goose Up
DROP INDEX bridge.delivery_streams_idle;

-- +goose Down
CREATE INDEX delivery_streams_idle ON bridge.delivery_streams (subscription_id, asset_key)
  WHERE ready_at = 'infinity';
