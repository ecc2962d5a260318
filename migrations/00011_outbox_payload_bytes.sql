-- Why this exists: the relay must know how large a payload is before it reads
-- it. Reading a whole batch of payloads and then checking their sizes lets
-- 12 rows of 25 MB (over a 1 MB limit) take its memory to ten times its
-- usual size before they are parked, and a batch of enough of them would have killed
-- it — leaving them NEW, to be claimed again after every restart. Measuring
-- the size in the claim (octet_length of the JSON text) would detoast and
-- render every payload on every claim (~65 ms per 5 MB), so the size is
-- computed once, when the row is written, and the claim reads this column:
-- an oversized row is parked without its payload ever leaving the database,
-- and a batch is cut at RELAY_BATCH_BYTES.

-- +goose Up
-- +goose StatementBegin
ALTER TABLE bridge.outbox
  ADD COLUMN payload_bytes int GENERATED ALWAYS AS (octet_length(payload::text)) STORED;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
ALTER TABLE bridge.outbox DROP COLUMN payload_bytes;
-- +goose StatementEnd
