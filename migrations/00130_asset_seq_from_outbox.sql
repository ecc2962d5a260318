-- Why this exists: bridge.enqueue advanced the asset's counter row
-- (bridge.asset_counters) once per event, and outbox.EnqueueBatch rewrote it
-- once more to lock it: two new row versions per event. While another
-- session holds a transaction open (a long report, a forgotten psql), none
-- of those versions can be pruned, and every later write of the asset walks
-- all of them: after 17 minutes at ~1,100 events/s over 1,000 assets the
-- application's writers had fallen from 2,400 to ~530 events/s, queued on
-- each other's counter rows, while the relay kept up. A writer's cost must
-- not grow with how long someone else's transaction has been open.
--
-- The counter row stays the per-asset writer lock (held until COMMIT, so for
-- one asset seq order = commit order, and a rollback leaves no gap), but it
-- is only locked, never rewritten, by a writer. The asset's last asset_seq is
-- read from its newest outbox row instead: one step down the unique index
-- outbox_asset_seq, which holds a bounded number of versions per key (the
-- row and, once marked, its SENT version), however long the xmin horizon is
-- pinned. The counter only keeps the number once the asset's newest row is
-- deleted (retention, an operator): bridge.keep_last_asset_seq raises it in
-- the deleting statement, so the next event of an asset idle for longer
-- than the retention still continues its numbering.
--
-- Under REPEATABLE READ or SERIALIZABLE, a transaction whose snapshot is
-- older than another writer's commit of the same asset now fails with
-- unique_violation on outbox_asset_seq (before this migration,
-- serialization_failure on the counter row): either way it rolls back and
-- nothing of it is published.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION bridge.enqueue(
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
  v_problem text;
BEGIN
  IF topic IS NULL OR btrim(topic) = '' THEN
    RAISE EXCEPTION 'bridge.enqueue: topic must not be empty' USING ERRCODE = '22023';
  END IF;
  -- A row whose topic Kafka refuses can never be sent: refuse it here, in
  -- the writer's transaction, rather than park it later.
  v_problem := bridge.topic_name_problem(topic);
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION 'bridge.enqueue: topic % is not a valid Kafka topic name: %', quote_literal(left(topic, 300)), v_problem
      USING ERRCODE = '22023';
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

  -- Serialise this asset's writers until commit: lock its counter row,
  -- creating it at 0 the first time, without writing a new version of it
  -- (ON CONFLICT … WHERE false locks the existing row and updates nothing).
  INSERT INTO bridge.asset_counters AS c (asset_key, last_asset_seq)
  VALUES (v_asset_key, 0)
  ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = c.last_asset_seq WHERE false;
  -- A new statement, so a new snapshot: it sees what the writer this one
  -- waited for committed. The asset's last asset_seq is its newest outbox
  -- row (one step down outbox_asset_seq), or the counter, which keeps it
  -- once that row is deleted (bridge.keep_last_asset_seq).
  SELECT greatest(
           (SELECT c.last_asset_seq FROM bridge.asset_counters c WHERE c.asset_key = v_asset_key),
           (SELECT o.asset_seq FROM bridge.outbox o
            WHERE coalesce(o.asset_id, '') = v_asset_key
            ORDER BY coalesce(o.asset_id, '') DESC, o.asset_seq DESC
            LIMIT 1)) + 1
  INTO v_asset_seq;

  INSERT INTO bridge.outbox AS o (asset_seq, topic, asset_id, lane, event_type, payload, headers, traceparent, tracestate)
  VALUES (v_asset_seq, enqueue.topic, nullif(enqueue.asset_id, ''), bridge.lane_of(v_asset_key),
          enqueue.event_type, enqueue.payload, headers, v_traceparent, v_tracestate)
  RETURNING o.id INTO v_id;
  RETURN v_id;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Raise the counters of the assets whose newest outbox row a statement
-- deleted, to that row's asset_seq (never lower it). Only those assets: an
-- asset with a newer row left still reads its number from that row, so
-- retention deleting old rows of busy assets locks no counter (and makes
-- their writers wait for nothing). Counters are locked in key order, as
-- outbox.EnqueueBatch locks them.
CREATE FUNCTION bridge.keep_last_asset_seq() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO bridge.asset_counters AS c (asset_key, last_asset_seq)
  SELECT d.asset_key, d.last_asset_seq
  FROM (SELECT coalesce(asset_id, '') AS asset_key, max(asset_seq) AS last_asset_seq FROM gone GROUP BY 1) d
  WHERE NOT EXISTS (SELECT 1 FROM bridge.outbox o
                    WHERE coalesce(o.asset_id, '') = d.asset_key AND o.asset_seq > d.last_asset_seq)
  ORDER BY d.asset_key
  ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = excluded.last_asset_seq
    WHERE c.last_asset_seq < excluded.last_asset_seq;
  RETURN NULL;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER outbox_keep_last_asset_seq AFTER DELETE ON bridge.outbox
REFERENCING OLD TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION bridge.keep_last_asset_seq();
-- +goose StatementEnd

-- +goose StatementBegin
-- TRUNCATE fires no delete trigger: keep every asset's number first.
CREATE FUNCTION bridge.keep_last_asset_seq_before_truncate() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO bridge.asset_counters AS c (asset_key, last_asset_seq)
  SELECT coalesce(asset_id, ''), max(asset_seq) FROM bridge.outbox GROUP BY 1 ORDER BY 1
  ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = excluded.last_asset_seq
    WHERE c.last_asset_seq < excluded.last_asset_seq;
  RETURN NULL;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER outbox_keep_last_asset_seq_before_truncate BEFORE TRUNCATE ON bridge.outbox
FOR EACH STATEMENT EXECUTE FUNCTION bridge.keep_last_asset_seq_before_truncate();
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP TRIGGER outbox_keep_last_asset_seq_before_truncate ON bridge.outbox;
DROP FUNCTION bridge.keep_last_asset_seq_before_truncate();
DROP TRIGGER outbox_keep_last_asset_seq ON bridge.outbox;
DROP FUNCTION bridge.keep_last_asset_seq();
-- +goose StatementEnd

-- +goose StatementBegin
-- Bring every counter up to its asset's newest row before enqueue goes back
-- to advancing it.
INSERT INTO bridge.asset_counters AS c (asset_key, last_asset_seq)
SELECT coalesce(asset_id, ''), max(asset_seq) FROM bridge.outbox GROUP BY 1 ORDER BY 1
ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = excluded.last_asset_seq
  WHERE c.last_asset_seq < excluded.last_asset_seq;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION bridge.enqueue(
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
  v_problem text;
BEGIN
  IF topic IS NULL OR btrim(topic) = '' THEN
    RAISE EXCEPTION 'bridge.enqueue: topic must not be empty' USING ERRCODE = '22023';
  END IF;
  -- A row whose topic Kafka refuses can never be sent: refuse it here, in
  -- the writer's transaction, rather than park it later.
  v_problem := bridge.topic_name_problem(topic);
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION 'bridge.enqueue: topic % is not a valid Kafka topic name: %', quote_literal(left(topic, 300)), v_problem
      USING ERRCODE = '22023';
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
-- +goose StatementEnd
