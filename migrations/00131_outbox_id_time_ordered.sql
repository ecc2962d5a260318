-- Why this exists: bridge.outbox's cost per row grew with the table. Its
-- primary key was a random UUID (gen_random_uuid), so every insert, and the
-- index entry of every row's SENT version (marking is not a HOT update), went
-- to a random page of outbox_pkey: the whole index is the working set, and
-- it grows with retention (3M rows after 10 minutes at 5,000 events/s, more
-- than shared_buffers here). Each vacuum of the outbox (every minute at that
-- rate) removed dead entries from every leaf page of it, dirtying and —
-- after each checkpoint — logging every page in full, so autovacuum's runs
-- grow with the table.
--
-- New ids are time-ordered UUIDs (version 7: 48 bits of Unix milliseconds,
-- then random bits; RFC 9562), so the rows written and marked in the last
-- minute sit on the rightmost pages of outbox_pkey, and a vacuum dirties
-- those, not the whole index. The id is still a UUID, unique, and the dedup
-- id; it now also tells when it was made (as created_at does). Existing ids
-- stay as they are.
--
-- The planner needs no statistics on the payload and the other columns no
-- statement filters on: ANALYZE (every minute on a busy outbox) skipped
-- computing them for the 30,000 rows it samples, jsonb payloads first.
--
-- vacuum_truncate off: a queue table's free pages at its end are reused by
-- the next inserts, and truncating them takes an ACCESS EXCLUSIVE lock that
-- stalls every writer and the relay while it is held.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION bridge.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
  -- a random (version 4) UUID with its first 48 bits replaced by the time in
  -- milliseconds, and its version nibble turned from 4 (0100) into 7 (0111)
  SELECT encode(
    set_bit(set_bit(
      overlay(uuid_send(gen_random_uuid())
              PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
              FROM 1 FOR 6),
      52, 1), 53, 1),
    'hex')::uuid
$$;
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE bridge.outbox ALTER COLUMN id SET DEFAULT bridge.uuid_v7();
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE bridge.outbox
  ALTER COLUMN payload SET STATISTICS 0,
  ALTER COLUMN headers SET STATISTICS 0,
  ALTER COLUMN traceparent SET STATISTICS 0,
  ALTER COLUMN tracestate SET STATISTICS 0,
  ALTER COLUMN last_error SET STATISTICS 0,
  ALTER COLUMN kafka_partition SET STATISTICS 0,
  ALTER COLUMN kafka_offset SET STATISTICS 0;
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE bridge.outbox SET (vacuum_truncate = false);
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
ALTER TABLE bridge.outbox RESET (vacuum_truncate);
ALTER TABLE bridge.outbox
  ALTER COLUMN payload SET STATISTICS -1,
  ALTER COLUMN headers SET STATISTICS -1,
  ALTER COLUMN traceparent SET STATISTICS -1,
  ALTER COLUMN tracestate SET STATISTICS -1,
  ALTER COLUMN last_error SET STATISTICS -1,
  ALTER COLUMN kafka_partition SET STATISTICS -1,
  ALTER COLUMN kafka_offset SET STATISTICS -1;
ALTER TABLE bridge.outbox ALTER COLUMN id SET DEFAULT gen_random_uuid();
DROP FUNCTION bridge.uuid_v7();
-- +goose StatementEnd
