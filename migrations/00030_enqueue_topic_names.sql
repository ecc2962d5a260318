-- Why this exists: bridge.enqueue accepted topic names Kafka refuses
-- ('ux.bad topic', 300 characters, '..', 'ux/slash', non-ASCII,
-- '__consumer_offsets'). Such a row commits with the application's change,
-- then can never be produced: the relay parks it as FAILED long after the
-- transaction that wrote it, where nobody who could fix it is looking. Now the
-- call itself fails, naming the rule, inside the caller's transaction.

-- +goose Up
-- +goose StatementBegin

-- What is wrong with a topic name, or NULL when Kafka accepts it: 1 to 249
-- characters of ASCII letters, digits, '.', '_' and '-', not '.' or '..'
-- (Kafka's rules), and not starting with '__' (Kafka's internal topics, such
-- as __consumer_offsets). outbox.Enqueue applies the same rules in Go.
CREATE FUNCTION bridge.topic_name_problem(topic text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE
    WHEN topic IS NULL OR topic = '' THEN 'it must not be empty'
    WHEN length(topic) > 249 THEN 'it is ' || length(topic) || ' characters long; at most 249 are allowed'
    WHEN topic IN ('.', '..') THEN '''.'' and ''..'' are not allowed'
    WHEN topic !~ '^[a-zA-Z0-9._-]+$' THEN 'only ASCII letters, digits, ''.'', ''_'' and ''-'' are allowed'
    WHEN starts_with(topic, '__') THEN 'names starting with ''__'' are reserved for Kafka''s internal topics'
  END
$$;

-- bridge.enqueue: call it inside your own transaction; returns the dedup id.
-- Bad input fails the call (and the caller's transaction decides what to do),
-- except a malformed traceparent, which is dropped with a WARNING: losing a
-- trace link must never fail a business transaction.
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

-- +goose Down
-- +goose StatementBegin
-- bridge.enqueue: call it inside your own transaction; returns the dedup id.
-- Bad input fails the call (and the caller's transaction decides what to do),
-- except a malformed traceparent, which is dropped with a WARNING: losing a
-- trace link must never fail a business transaction.
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

DROP FUNCTION bridge.topic_name_problem(text);
-- +goose StatementEnd
