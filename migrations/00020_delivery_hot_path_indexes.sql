-- Why this exists: every claim and every outcome is an UPDATE that changes
-- status, an indexed column, so none of them is a HOT update and each one
-- adds an entry to every index of bridge.deliveries whose predicate the new
-- row version matches. Three indexes were paid for on that path and read by
-- nothing on it:
--   - deliveries_pending_due (subscription_id, seq) WHERE pending: the claim
--     has found stream heads through bridge.delivery_streams and
--     deliveries_open_by_stream since the streams table came in; nothing
--     else reads it.
--   - deliveries_delivering_lease (lease_expires_at) WHERE delivering: read
--     only by reclaim_stalled, every WEBHOOK_LEASE/4, which can as well walk
--     deliveries_in_flight_by_stream (the same rows: at most one per stream
--     in flight). Worse, the planner picked it for the claim's "is this
--     stream in flight?" probe, walking every in-flight row per stream
--     looked at.
--   - the UNIQUE index on seq: seq comes from a sequence, so it is unique
--     by construction; ordering reads it through deliveries_open_by_stream.
-- Claims now touch 5 indexes instead of 7, outcomes 4 instead of 5.

-- +goose Up
DROP INDEX bridge.deliveries_pending_due;
DROP INDEX bridge.deliveries_delivering_lease;
ALTER TABLE bridge.deliveries DROP CONSTRAINT deliveries_seq_key;

-- +goose Down
ALTER TABLE bridge.deliveries ADD CONSTRAINT deliveries_seq_key UNIQUE (seq);
CREATE INDEX deliveries_delivering_lease ON bridge.deliveries (lease_expires_at) WHERE status = 'delivering';
CREATE INDEX deliveries_pending_due ON bridge.deliveries (subscription_id, seq) WHERE status = 'pending';
