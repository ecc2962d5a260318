-- Why this exists: since migration 00131 every new outbox id is a UUIDv7
-- whose first 48 bits are the time in milliseconds, so every insert (and the
-- primary-key entry of every row's SENT version: marking is not a HOT
-- update) goes to the same rightmost leaf page of outbox_pkey. Concurrent
-- writers then queue for that one page (its buffer lock), as they already
-- do for the rightmost page of the seq index: measured with 8 writers of 10
-- events per transaction, the enqueue with the millisecond-ordered id
-- committed 604–654 transactions/s where the same enqueue with a random id
-- committed 656–766 (alternated runs, one database), with no difference from
-- a single writer.
--
-- New ids keep the time order at the scale that matters to vacuum but not
-- within a minute: the first 32 bits are the time in units of 65.536 s
-- (milliseconds >> 16), the 16 bits after them — the low bits of the
-- millisecond timestamp in RFC 9562's layout, which it allows to be altered —
-- are random, like the rest. The rows of the last minute or two still sit on
-- a bounded set of outbox_pkey pages (what 00131 was for: a vacuum dirties
-- those, not the whole index), but concurrent inserts land on random pages
-- of that set instead of one. The id is still a version 7 UUID, unique
-- (90 random bits), and the dedup id; it tells its creation time to about a
-- minute.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION bridge.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
  -- a random (version 4) UUID with its first 32 bits replaced by the time
  -- in units of 2^16 ms, and its version nibble turned from 4 (0100) into
  -- 7 (0111)
  SELECT encode(
    set_bit(set_bit(
      overlay(uuid_send(gen_random_uuid())
              PLACING int4send((floor(date_part('epoch', clock_timestamp()) * 1000)::bigint >> 16)::int)
              FROM 1 FOR 4),
      52, 1), 53, 1),
    'hex')::uuid
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION bridge.uuid_v7() RETURNS uuid
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
