-- Why this exists: the console's health figures count the last hour's
-- attempts of both lanes. The fast lane's attempt log is append-only in
-- started_at order, so a BRIN index (a few pages per day partition) finds
-- the last hour without a scan of the day's partition and costs its
-- inserts next to nothing.

-- +goose Up
CREATE INDEX webhook_attempts_started_at ON bridge.webhook_attempts USING brin (started_at);

-- +goose Down
DROP INDEX bridge.webhook_attempts_started_at;
