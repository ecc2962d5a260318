-- Why this exists: delivered deliveries and their attempt logs were kept
-- forever, so bridge.deliveries grew with the traffic and every index with it
-- (the claim's partial indexes stay small, but the heap, the log queries and
-- vacuum do not). The deliverer now deletes delivered rows older than
-- WEBHOOK_RETENTION in bounded batches (attempts go with them, ON DELETE
-- CASCADE); this index makes each batch a range scan of the oldest delivered
-- rows instead of a scan of the table. Dead deliveries are kept: an operator
-- may still revive them.

-- +goose Up
CREATE INDEX deliveries_delivered_at ON bridge.deliveries (delivered_at) WHERE status = 'delivered';

-- +goose Down
DROP INDEX bridge.deliveries_delivered_at;
