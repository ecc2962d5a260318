-- Why this exists: an application must be able to record "this happened" in the
-- same transaction as the change itself. Emitting after COMMIT loses events when
-- the process dies between the two; emitting before COMMIT announces changes that
-- may still roll back. bridge.outbox is the table that transaction writes to, and
-- bridge.enqueue() is the one call any language uses to write it.

-- +goose Up
-- +goose StatementBegin
CREATE SCHEMA IF NOT EXISTS bridge;

-- Number of relay lanes. An asset always hashes to the same lane, and a lane is
-- leased to exactly one relay replica at a time, so one asset's events are only
-- ever produced by one replica (see 00002). Changing it would move assets
-- between lanes while rows are in flight: it is fixed by migration, not config.
CREATE FUNCTION bridge.lane_count() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 64 $$;

-- The lane of an asset key ('' is the null-asset stream).
CREATE FUNCTION bridge.lane_of(asset_key text) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT ((hashtextextended(asset_key, 0) & 2147483647) % bridge.lane_count())::int
$$;

-- Per-asset counters. enqueue upserts the asset's row, and the row lock it takes
-- is held until the writer's transaction ends. A second transaction writing the
-- same asset therefore waits, and takes its asset_seq (and its outbox seq) only
-- after the first one committed: for one asset, seq order = commit order, which
-- is the order the relay produces in. Because the counter is only advanced by a
-- transaction that commits (a rollback undoes the increment), asset_seq is
-- gapless: a consumer that sees 7 after 5 knows it missed one.
-- Cost: writers of one asset serialise for the rest of their transaction.
CREATE TABLE bridge.asset_counters (
  asset_key text PRIMARY KEY,           -- asset id; '' for the null-asset stream
  last_asset_seq bigint NOT NULL
);

CREATE TABLE bridge.outbox (
  id              uuid PRIMARY KEY DEFAULT gen_random_uuid(), -- the dedup id
  -- Relay order. Never created_at: now() is the transaction start time, so every
  -- event of one transaction ties, and "publish v2 and expire v1" would come out
  -- in random order.
  -- No UNIQUE index on seq (an identity is unique by construction): a full
  -- index on seq would offer the planner a seq-ordered walk over every SENT
  -- row, and a generic plan for the claim took it (100 ms per claim after a
  -- 100,000-row drain instead of 2 ms on outbox_new_by_seq).
  seq             bigint GENERATED ALWAYS AS IDENTITY,
  asset_seq       bigint NOT NULL,
  topic           text NOT NULL,
  asset_id        text,                 -- NULL: the null-asset stream
  lane            int NOT NULL,
  event_type      text NOT NULL,
  payload         jsonb NOT NULL,
  headers         jsonb NOT NULL DEFAULT '{}'::jsonb,
  traceparent     text,
  tracestate      text,
  status          text NOT NULL DEFAULT 'NEW',
  -- The seed's missing integer: every failed send that belongs to the row is
  -- counted, so a row that can never be sent is parked as FAILED instead of
  -- being retried forever while everything behind it piles up.
  attempts        int NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  last_error      text,
  created_at      timestamptz NOT NULL DEFAULT now(),
  sent_at         timestamptz,
  failed_at       timestamptz,
  replayed_at     timestamptz,
  kafka_partition int,
  kafka_offset    bigint,
  CONSTRAINT outbox_status_valid CHECK (status IN ('NEW', 'SENT', 'FAILED')),
  CONSTRAINT outbox_topic_not_empty CHECK (topic <> ''),
  CONSTRAINT outbox_event_type_not_empty CHECK (event_type <> ''),
  CONSTRAINT outbox_headers_object CHECK (jsonb_typeof(headers) = 'object')
);

-- asset_seq is gapless and unique per asset (the null asset is one stream).
CREATE UNIQUE INDEX outbox_asset_seq ON bridge.outbox ((coalesce(asset_id, '')), asset_seq);

-- The claim scans NEW rows in seq order (filtering to the lanes a replica
-- holds): a partial index keeps that cost proportional to the backlog, not to
-- the table's history.
CREATE INDEX outbox_new_by_seq ON bridge.outbox (seq) INCLUDE (lane, next_attempt_at) WHERE status = 'NEW';
-- "Is an earlier row of this asset waiting for its retry?" — one probe on an
-- index holding only charged NEW rows (attempts > 0), which are few even with
-- a million-row backlog, so the per-asset hold stays cheap.
CREATE INDEX outbox_waiting_retry ON bridge.outbox ((coalesce(asset_id, '')), seq) WHERE status = 'NEW' AND attempts > 0;
-- Retention deletes SENT rows oldest first in bounded batches.
CREATE INDEX outbox_sent_at ON bridge.outbox (sent_at) WHERE status = 'SENT';
CREATE INDEX outbox_failed ON bridge.outbox (topic, failed_at) WHERE status = 'FAILED';

-- A queue table: every row is updated once (NEW → SENT) and later deleted.
-- Vacuum it early rather than at 20% dead tuples, so the dead entries marking
-- leaves in the NEW index are cleared while they are few, and keep its
-- statistics fresh for the claim's plan.
ALTER TABLE bridge.outbox SET (
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_threshold = 1000,
  autovacuum_analyze_scale_factor = 0.02);

-- bridge.enqueue: call it inside your own transaction; returns the dedup id.
-- Bad input fails the call (and the caller's transaction decides what to do),
-- except a malformed traceparent, which is dropped with a WARNING: losing a
-- trace link must never fail a business transaction.
CREATE FUNCTION bridge.enqueue(
  topic text,
  asset_id text,
  event_type text,
  payload jsonb,
  headers jsonb DEFAULT '{}'::jsonb,
  traceparent text DEFAULT NULL,
  tracestate text DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql AS $fn$
#variable_conflict use_variable
DECLARE
  v_asset_key text := coalesce(asset_id, '');
  v_asset_seq bigint;
  v_id uuid;
  v_traceparent text := traceparent;
  v_tracestate text := tracestate;
BEGIN
  IF topic IS NULL OR btrim(topic) = '' THEN
    RAISE EXCEPTION 'bridge.enqueue: topic must not be empty' USING ERRCODE = '22023';
  END IF;
  IF event_type IS NULL OR btrim(event_type) = '' THEN
    RAISE EXCEPTION 'bridge.enqueue: event_type must not be empty' USING ERRCODE = '22023';
  END IF;
  IF payload IS NULL THEN
    RAISE EXCEPTION 'bridge.enqueue: payload must not be NULL (use the JSON null literal)' USING ERRCODE = '22023';
  END IF;
  IF headers IS NULL THEN
    headers := '{}'::jsonb;
  END IF;
  IF jsonb_typeof(headers) <> 'object' THEN
    RAISE EXCEPTION 'bridge.enqueue: headers must be a JSON object of strings, got %', jsonb_typeof(headers) USING ERRCODE = '22023';
  END IF;
  IF EXISTS (SELECT 1 FROM jsonb_each(headers) h WHERE jsonb_typeof(h.value) <> 'string') THEN
    RAISE EXCEPTION 'bridge.enqueue: every header value must be a JSON string' USING ERRCODE = '22023';
  END IF;
  -- W3C trace-context: version 00, 32 hex trace id (not all zero), 16 hex span
  -- id (not all zero), 2 hex flags.
  IF v_traceparent IS NOT NULL AND (
       v_traceparent !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       OR substr(v_traceparent, 4, 32) = repeat('0', 32)
       OR substr(v_traceparent, 37, 16) = repeat('0', 16)) THEN
    RAISE WARNING 'bridge.enqueue: dropping malformed traceparent %', quote_literal(v_traceparent);
    v_traceparent := NULL;
    v_tracestate := NULL;
  END IF;

  -- Serialise this asset's writers until commit (see bridge.asset_counters).
  INSERT INTO bridge.asset_counters AS c (asset_key, last_asset_seq)
  VALUES (v_asset_key, 1)
  ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = c.last_asset_seq + 1
  RETURNING c.last_asset_seq INTO v_asset_seq;

  INSERT INTO bridge.outbox AS o (asset_seq, topic, asset_id, lane, event_type, payload, headers, traceparent, tracestate)
  VALUES (v_asset_seq, enqueue.topic, nullif(enqueue.asset_id, ''), bridge.lane_of(v_asset_key),
          enqueue.event_type, enqueue.payload, headers, v_traceparent, v_tracestate)
  RETURNING o.id INTO v_id;
  RETURN v_id;
END
$fn$;

-- Wake the relays as soon as a row is committed (NOTIFY is delivered at commit,
-- and never for a rolled-back transaction). One notification per statement:
-- the relay claims whatever is there, it does not need one per row.
CREATE FUNCTION bridge.notify_outbox() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pg_notify('bridge_outbox', '');
  RETURN NULL;
END
$fn$;

CREATE TRIGGER outbox_notify AFTER INSERT ON bridge.outbox
FOR EACH STATEMENT EXECUTE FUNCTION bridge.notify_outbox();
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP SCHEMA bridge CASCADE;
-- +goose StatementEnd
