-- Why this exists: an asset id of 2,680 bytes passed bridge.enqueue (its
-- counter's index still fitted), was relayed, and then every consumer batch
-- holding it failed with SQLSTATE 54000 (index row size exceeds the btree
-- maximum, in deliveries_open_by_stream); 3,200 bytes were refused at
-- enqueue, but with a raw 54000 naming asset_counters_pkey rather than the
-- argument. Every field that reaches an index now has a bound, checked where
-- the event enters, with SQLSTATE 22023 and a message naming the argument
-- and the limit (docs/contract.md, "Bounds").
--
-- bridge.check_event_bounds is the one SQL copy of the bounds (the Go copy
-- is internal/eventbounds; a test keeps them equal): it returns what is too
-- long, or NULL. bridge.enqueue and bridge.enqueue_batch call it after their
-- own checks; any other writer of bridge.outbox calls it too. Byte lengths
-- (octet_length), since an index entry's size is in bytes:
--   topic 249, asset_id 512, event_type 256, headers: at most 64, each name
--   256 and each value 8,192.
-- Rows already in the outbox are not touched; the consumer dead-letters a
-- record over a bound on its own.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION bridge.check_event_bounds(topic text, asset_id text, event_type text, headers jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
  v_n int;
  v_name text;
  v_len int;
BEGIN
  IF octet_length(topic) > 249 THEN
    RETURN format('topic is %s bytes long; at most 249 are allowed', octet_length(topic));
  END IF;
  IF octet_length(asset_id) > 512 THEN
    RETURN format('asset_id is %s bytes long; at most 512 are allowed', octet_length(asset_id));
  END IF;
  IF octet_length(event_type) > 256 THEN
    RETURN format('event_type is %s bytes long; at most 256 are allowed', octet_length(event_type));
  END IF;
  IF headers IS NULL OR jsonb_typeof(headers) <> 'object' THEN
    RETURN NULL;
  END IF;
  SELECT count(*) INTO v_n FROM jsonb_object_keys(headers);
  IF v_n > 64 THEN
    RETURN format('headers has %s entries; at most 64 are allowed', v_n);
  END IF;
  SELECT octet_length(h.key) INTO v_len FROM jsonb_each_text(headers) h
  WHERE octet_length(h.key) > 256 ORDER BY h.key COLLATE "C" LIMIT 1;
  IF v_len IS NOT NULL THEN
    RETURN format('headers has a name %s bytes long; at most 256 are allowed', v_len);
  END IF;
  SELECT h.key, octet_length(h.value) INTO v_name, v_len FROM jsonb_each_text(headers) h
  WHERE octet_length(h.value) > 8192 ORDER BY h.key COLLATE "C" LIMIT 1;
  IF v_name IS NOT NULL THEN
    RETURN format('headers value of ''%s'' is %s bytes long; at most 8192 are allowed', v_name, v_len);
  END IF;
  RETURN NULL;
END
$fn$;
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
  v_problem := bridge.check_event_bounds(topic, asset_id, event_type, headers);
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION 'bridge.enqueue: %', v_problem USING ERRCODE = '22023';
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
CREATE OR REPLACE FUNCTION bridge.enqueue_batch(
  topics text[],
  asset_ids text[],
  event_types text[],
  payloads jsonb[],
  headers jsonb[],
  traceparents text[],
  tracestates text[]
) RETURNS SETOF uuid
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
  n int := coalesce(cardinality(topics), 0);
  v_ord bigint;
  v_problem text;
  v_bad text;
BEGIN
  IF n = 0 THEN
    RETURN;
  END IF;
  IF coalesce(cardinality(asset_ids), -1) <> n OR coalesce(cardinality(event_types), -1) <> n
     OR coalesce(cardinality(payloads), -1) <> n OR coalesce(cardinality(headers), -1) <> n
     OR coalesce(cardinality(traceparents), -1) <> n OR coalesce(cardinality(tracestates), -1) <> n THEN
    RAISE EXCEPTION 'bridge.enqueue_batch: every array must hold one element per event (% topics)', n USING ERRCODE = '22023';
  END IF;

  -- bridge.enqueue's checks, the first failing event named (CASE stops at
  -- the first true branch, so jsonb_each only sees an object).
  SELECT u.ord, CASE
           WHEN u.t IS NULL OR btrim(u.t) = '' THEN 'topic must not be empty'
           WHEN bridge.topic_name_problem(u.t) IS NOT NULL THEN
             format('topic %s is not a valid Kafka topic name: %s', quote_literal(left(u.t, 300)), bridge.topic_name_problem(u.t))
           WHEN u.e IS NULL OR btrim(u.e) = '' THEN 'event_type must not be empty'
           WHEN u.p IS NULL THEN 'payload must not be NULL (use the JSON null literal)'
           WHEN u.h IS NOT NULL AND jsonb_typeof(u.h) <> 'object' THEN
             'headers must be a JSON object of strings, got ' || jsonb_typeof(u.h)
           WHEN u.h IS NOT NULL AND EXISTS (SELECT 1 FROM jsonb_each(u.h) x WHERE jsonb_typeof(x.value) <> 'string') THEN
             'every header value must be a JSON string'
           ELSE bridge.check_event_bounds(u.t, u.a, u.e, u.h)
         END
  INTO v_ord, v_problem
  FROM unnest(topics, asset_ids, event_types, payloads, headers) WITH ORDINALITY AS u(t, a, e, p, h, ord)
  WHERE u.t IS NULL OR btrim(u.t) = '' OR bridge.topic_name_problem(u.t) IS NOT NULL
     OR u.e IS NULL OR btrim(u.e) = '' OR u.p IS NULL
     OR (u.h IS NOT NULL AND (jsonb_typeof(u.h) <> 'object'
                              OR EXISTS (SELECT 1 FROM jsonb_each(u.h) x WHERE jsonb_typeof(x.value) <> 'string')))
     OR bridge.check_event_bounds(u.t, u.a, u.e, u.h) IS NOT NULL
  ORDER BY u.ord
  LIMIT 1;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION 'bridge.enqueue_batch: event % (of %): %', v_ord, n, v_problem USING ERRCODE = '22023';
  END IF;
  -- A lost trace link must never fail a business transaction: warn, and the
  -- INSERT below drops it (bridge.traceparent_ok).
  FOR v_bad IN
    SELECT u.tp FROM unnest(traceparents) AS u(tp) WHERE u.tp IS NOT NULL AND NOT bridge.traceparent_ok(u.tp)
  LOOP
    RAISE WARNING 'bridge.enqueue_batch: dropping malformed traceparent %', quote_literal(v_bad);
  END LOOP;

  -- Serialise each asset's writers until commit, in key order (see
  -- migration 00130: the counter row is locked, never rewritten).
  INSERT INTO bridge.asset_counters AS c (asset_key, last_asset_seq)
  SELECT DISTINCT coalesce(a, ''), 0 FROM unnest(asset_ids) AS a ORDER BY 1
  ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = c.last_asset_seq WHERE false;

  -- A new statement, so a new snapshot: it sees what the writers this one
  -- waited for committed. Each asset's events continue after its newest
  -- outbox row or its counter, in array order; rows are inserted (and take
  -- their seq) in array order.
  RETURN QUERY
  WITH ev AS (
    SELECT u.ord, u.t, nullif(u.a, '') AS a, coalesce(u.a, '') AS k, u.e, u.p, coalesce(u.h, '{}'::jsonb) AS h,
           CASE WHEN bridge.traceparent_ok(u.tp) THEN u.tp END AS tp,
           CASE WHEN bridge.traceparent_ok(u.tp) THEN u.ts END AS ts
    FROM unnest(topics, asset_ids, event_types, payloads, headers, traceparents, tracestates)
         WITH ORDINALITY AS u(t, a, e, p, h, tp, ts, ord)
  ),
  last AS (
    SELECT d.k, coalesce(greatest(
             (SELECT c.last_asset_seq FROM bridge.asset_counters c WHERE c.asset_key = d.k),
             (SELECT o.asset_seq FROM bridge.outbox o
              WHERE coalesce(o.asset_id, '') = d.k
              ORDER BY coalesce(o.asset_id, '') DESC, o.asset_seq DESC
              LIMIT 1)), 0) AS seq
    FROM (SELECT DISTINCT ev.k FROM ev) d
  ),
  numbered AS (
    SELECT ev.*, l.seq + row_number() OVER (PARTITION BY ev.k ORDER BY ev.ord) AS asset_seq
    FROM ev JOIN last l ON l.k = ev.k
  ),
  ins AS (
    INSERT INTO bridge.outbox AS o (asset_seq, topic, asset_id, lane, event_type, payload, headers, traceparent, tracestate)
    SELECT x.asset_seq, x.t, x.a, bridge.lane_of(x.k), x.e, x.p, x.h, x.tp, x.ts
    FROM numbered x
    ORDER BY x.ord
    RETURNING o.id, o.seq
  )
  SELECT ins.id FROM ins ORDER BY ins.seq;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
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
CREATE OR REPLACE FUNCTION bridge.enqueue_batch(
  topics text[],
  asset_ids text[],
  event_types text[],
  payloads jsonb[],
  headers jsonb[],
  traceparents text[],
  tracestates text[]
) RETURNS SETOF uuid
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
  n int := coalesce(cardinality(topics), 0);
  v_ord bigint;
  v_problem text;
  v_bad text;
BEGIN
  IF n = 0 THEN
    RETURN;
  END IF;
  IF coalesce(cardinality(asset_ids), -1) <> n OR coalesce(cardinality(event_types), -1) <> n
     OR coalesce(cardinality(payloads), -1) <> n OR coalesce(cardinality(headers), -1) <> n
     OR coalesce(cardinality(traceparents), -1) <> n OR coalesce(cardinality(tracestates), -1) <> n THEN
    RAISE EXCEPTION 'bridge.enqueue_batch: every array must hold one element per event (% topics)', n USING ERRCODE = '22023';
  END IF;

  -- bridge.enqueue's checks, the first failing event named (CASE stops at
  -- the first true branch, so jsonb_each only sees an object).
  SELECT u.ord, CASE
           WHEN u.t IS NULL OR btrim(u.t) = '' THEN 'topic must not be empty'
           WHEN bridge.topic_name_problem(u.t) IS NOT NULL THEN
             format('topic %s is not a valid Kafka topic name: %s', quote_literal(left(u.t, 300)), bridge.topic_name_problem(u.t))
           WHEN u.e IS NULL OR btrim(u.e) = '' THEN 'event_type must not be empty'
           WHEN u.p IS NULL THEN 'payload must not be NULL (use the JSON null literal)'
           WHEN u.h IS NOT NULL AND jsonb_typeof(u.h) <> 'object' THEN
             'headers must be a JSON object of strings, got ' || jsonb_typeof(u.h)
           WHEN u.h IS NOT NULL AND EXISTS (SELECT 1 FROM jsonb_each(u.h) x WHERE jsonb_typeof(x.value) <> 'string') THEN
             'every header value must be a JSON string'
         END
  INTO v_ord, v_problem
  FROM unnest(topics, event_types, payloads, headers) WITH ORDINALITY AS u(t, e, p, h, ord)
  WHERE u.t IS NULL OR btrim(u.t) = '' OR bridge.topic_name_problem(u.t) IS NOT NULL
     OR u.e IS NULL OR btrim(u.e) = '' OR u.p IS NULL
     OR (u.h IS NOT NULL AND (jsonb_typeof(u.h) <> 'object'
                              OR EXISTS (SELECT 1 FROM jsonb_each(u.h) x WHERE jsonb_typeof(x.value) <> 'string')))
  ORDER BY u.ord
  LIMIT 1;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION 'bridge.enqueue_batch: event % (of %): %', v_ord, n, v_problem USING ERRCODE = '22023';
  END IF;
  -- A lost trace link must never fail a business transaction: warn, and the
  -- INSERT below drops it (bridge.traceparent_ok).
  FOR v_bad IN
    SELECT u.tp FROM unnest(traceparents) AS u(tp) WHERE u.tp IS NOT NULL AND NOT bridge.traceparent_ok(u.tp)
  LOOP
    RAISE WARNING 'bridge.enqueue_batch: dropping malformed traceparent %', quote_literal(v_bad);
  END LOOP;

  -- Serialise each asset's writers until commit, in key order (see
  -- migration 00130: the counter row is locked, never rewritten).
  INSERT INTO bridge.asset_counters AS c (asset_key, last_asset_seq)
  SELECT DISTINCT coalesce(a, ''), 0 FROM unnest(asset_ids) AS a ORDER BY 1
  ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = c.last_asset_seq WHERE false;

  -- A new statement, so a new snapshot: it sees what the writers this one
  -- waited for committed. Each asset's events continue after its newest
  -- outbox row or its counter, in array order; rows are inserted (and take
  -- their seq) in array order.
  RETURN QUERY
  WITH ev AS (
    SELECT u.ord, u.t, nullif(u.a, '') AS a, coalesce(u.a, '') AS k, u.e, u.p, coalesce(u.h, '{}'::jsonb) AS h,
           CASE WHEN bridge.traceparent_ok(u.tp) THEN u.tp END AS tp,
           CASE WHEN bridge.traceparent_ok(u.tp) THEN u.ts END AS ts
    FROM unnest(topics, asset_ids, event_types, payloads, headers, traceparents, tracestates)
         WITH ORDINALITY AS u(t, a, e, p, h, tp, ts, ord)
  ),
  last AS (
    SELECT d.k, coalesce(greatest(
             (SELECT c.last_asset_seq FROM bridge.asset_counters c WHERE c.asset_key = d.k),
             (SELECT o.asset_seq FROM bridge.outbox o
              WHERE coalesce(o.asset_id, '') = d.k
              ORDER BY coalesce(o.asset_id, '') DESC, o.asset_seq DESC
              LIMIT 1)), 0) AS seq
    FROM (SELECT DISTINCT ev.k FROM ev) d
  ),
  numbered AS (
    SELECT ev.*, l.seq + row_number() OVER (PARTITION BY ev.k ORDER BY ev.ord) AS asset_seq
    FROM ev JOIN last l ON l.k = ev.k
  ),
  ins AS (
    INSERT INTO bridge.outbox AS o (asset_seq, topic, asset_id, lane, event_type, payload, headers, traceparent, tracestate)
    SELECT x.asset_seq, x.t, x.a, bridge.lane_of(x.k), x.e, x.p, x.h, x.tp, x.ts
    FROM numbered x
    ORDER BY x.ord
    RETURNING o.id, o.seq
  )
  SELECT ins.id FROM ins ORDER BY ins.seq;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
DROP FUNCTION bridge.check_event_bounds(text, text, text, jsonb);
-- +goose StatementEnd
