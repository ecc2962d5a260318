-- Why this exists: the console's subscription health ("success rate over the
-- last hour", deliveries per second) reads the attempts started in a recent
-- window. Without an index that is a scan of the whole attempt log, which
-- grows with every webhook sent until WEBHOOK_RETENTION prunes it.

-- +goose Up
CREATE INDEX delivery_attempts_started_at ON bridge.delivery_attempts (started_at);

-- +goose Down
DROP INDEX bridge.delivery_attempts_started_at;
