-- Why this exists: the deliverer must know how large a payload is before it
-- reads it. Its claims were bounded by rows only, so its memory was bounded
-- by (claims out) × (largest payload): 2 × WEBHOOK_WORKERS payloads of a few
-- MB each would take hundreds of MiB, and enough of them would kill it —
-- leaving them 'delivering', reclaimed, claimed again after every restart.
-- Measuring the size in the claim (octet_length of the JSON text) would
-- detoast and render every payload looked at, so the size is computed once,
-- when the row is written (the same rule as bridge.outbox.payload_bytes), and
-- the claim reads this column to stop at the deliverer's byte budget
-- (WEBHOOK_CLAIM_BYTES).

-- +goose Up
-- +goose StatementBegin
ALTER TABLE bridge.deliveries
  ADD COLUMN payload_bytes int GENERATED ALWAYS AS (octet_length(payload::text)) STORED;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
ALTER TABLE bridge.deliveries DROP COLUMN payload_bytes;
-- +goose StatementEnd
