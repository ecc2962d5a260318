-- Why this exists: outbox.EnqueueBatch wrote a transaction's events as one
-- bridge.enqueue call per event (pipelined, but each its own statement): per
-- event a plpgsql call, its own lock and newest-row lookup statements, its
-- own INSERT statement and the outbox's statement trigger. At 5,000 events/s
-- in transactions of 10 from 8 writers the writers' PostgreSQL backends were
-- most of the machine's two cores, their transactions took 17 ms at the
-- median, and they committed only 4,400–4,600 events/s of the 5,000 offered.
--
-- bridge.enqueue_batch writes the events of one call with a fixed number of
-- statements, whatever their count: one validation query, one lock statement
-- (every asset's counter row, in key order, as EnqueueBatch's pre-lock did:
-- two batches touching the same assets in different orders cannot
-- deadlock), and one INSERT … SELECT that numbers each asset's events after
-- its newest row (or its counter, see migration 00130) and fires the
-- outbox's trigger once. The rules are bridge.enqueue's, event by event: the
-- same checks and messages (SQLSTATE 22023, naming the event), a malformed
-- traceparent dropped with a WARNING, per asset asset_seq gapless and in
-- commit order (the counter row stays locked until COMMIT), and seq in the
-- order of the arrays, so a transaction's events are relayed in the order
-- given. The lookup runs in a statement after the lock statement, so it sees
-- what the writers this one waited for committed.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION bridge.enqueue_batch(
  topics text[],
  asset_ids text[],
  event_types text[],
  payloads jsonb[],
  headers jsonb[],
  traceparents text[],
  tracestates text[]
) RETURNS SETOF uuid
LANGUAGE plpgsql AS $fn$
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
-- W3C trace-context as bridge.enqueue checks it: version 00, 32 hex trace id
-- (not all zero), 16 hex span id (not all zero), 2 hex flags. NULL is "no
-- trace context", not malformed.
CREATE FUNCTION bridge.traceparent_ok(tp text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT tp IS NOT NULL
     AND tp ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
     AND substr(tp, 4, 32) <> repeat('0', 32)
     AND substr(tp, 37, 16) <> repeat('0', 16)
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP FUNCTION bridge.enqueue_batch(text[], text[], text[], jsonb[], jsonb[], text[], text[]);
DROP FUNCTION bridge.traceparent_ok(text);
-- +goose StatementEnd
