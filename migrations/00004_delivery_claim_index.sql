-- Why this exists: the delivery claim's second sibling probe — "is anything of
-- this (subscription, asset) stream in flight?" — had only
-- deliveries_open_by_stream to use, which holds every pending row too, so the
-- probe walked the stream's whole backlog: a claim cost O(backlog), about 90 ms
-- for 32 rows over a 20,000-row backlog (HARD-PARTS 6, "Trap"). In-flight rows
-- are few (at most one per stream), so a partial index on them keeps the probe
-- one lookup. The probe is needed because revive reopens a dead row in front
-- of a stream whose later row may be in flight.

-- +goose Up
CREATE INDEX deliveries_in_flight_by_stream ON bridge.deliveries (subscription_id, (coalesce(asset_id, '')))
  WHERE status = 'delivering';

-- +goose Down
DROP INDEX bridge.deliveries_in_flight_by_stream;
