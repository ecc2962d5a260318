-- Why this exists: every event row was written three more times after its
-- insert — claimed, marked SENT, deleted by retention — and each of those
-- writes left a dead tuple. While any session held a snapshot open (a report
-- on the application's database), none of them could be removed: a 3-minute
-- run at 5,000 events/s left 896,004 dead tuples, one per event, and the
-- relay could not pass the speed of a one-statement claim+mark.
--
-- The outbox is now a log, PgQ's design:
--
-- - Events are appended to bridge.outbox_log, partitioned into four tables
--   used in rotation (bridge.outbox_log_tables says which one takes new
--   events). No statement of the bridge updates or deletes a log row; a
--   table is emptied whole by TRUNCATE (bridge.outbox_log_rotate).
-- - Each row records its writer's transaction id (xid, xid8). A relay lane's
--   position is a snapshot (bridge.relay_positions): the lane has
--   passed exactly the events whose xid that snapshot sees as committed. A
--   batch is the events visible in a newer snapshot and not in the lane's,
--   read by xid: those at or above the old snapshot's xmax, and those of
--   transactions in its in-progress list. A transaction that commits late
--   is in the next batch after its commit; nothing is skipped or read twice.
-- - The position is the only thing the happy path writes. Rows whose send
--   failed, and the later rows of their asset, are copied into
--   bridge.outbox_held (keyed by the event id, with attempts,
--   next_attempt_at, last_error and status NEW or FAILED), where they wait,
--   are retried, parked and replayed; a held row that goes out is deleted
--   from it.
-- - bridge.outbox is a view of both, with the status derived: FAILED or NEW
--   from bridge.outbox_held, otherwise SENT once the row's lane has passed
--   it and NEW before.
--
-- The dedup id stays unique across the tables: a partitioned table's unique
-- index must include the partition key, so each id names its table in its
-- two lowest bits (bridge.outbox_log_id), a CHECK holds every row to the
-- table its id names, and the primary key (id, tbl) makes the id unique.
--
-- The upgrade moves the old table's NEW rows into the log in seq order, with
-- their ids, seqs and asset_seqs: they become visible at this migration's
-- commit, before any later event of their assets, and the lanes start from
-- a position that has not passed them. Charged NEW rows and FAILED rows go
-- to bridge.outbox_held as they were. SENT rows, which only waited for
-- retention, are not carried over.

-- +goose Up
-- +goose StatementBegin
CREATE SEQUENCE bridge.outbox_log_seq;
SELECT setval('bridge.outbox_log_seq', greatest((SELECT max(seq) FROM bridge.outbox), 1));
-- +goose StatementEnd

-- +goose StatementBegin
-- The dedup id of a new event in table tbl: a time-ordered UUID whose two
-- lowest bits are the table's number.
CREATE FUNCTION bridge.outbox_log_id(tbl int) RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  b bytea := uuid_send(bridge.uuid_v7());
BEGIN
  RETURN encode(set_byte(b, 15, (get_byte(b, 15) & 252) | tbl), 'hex')::uuid;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TABLE bridge.outbox_log (
  tbl           smallint NOT NULL,        -- the table of the rotation (0-3) the row is in
  id            uuid NOT NULL,            -- the dedup id; its two lowest bits are tbl
  seq           bigint NOT NULL DEFAULT nextval('bridge.outbox_log_seq'), -- relay order within a batch
  xid           xid8 NOT NULL DEFAULT pg_current_xact_id(), -- the writer's transaction
  asset_seq     bigint NOT NULL,
  topic         text NOT NULL,
  asset_id      text,                     -- NULL: the null-asset stream
  lane          int NOT NULL,
  event_type    text NOT NULL,
  payload       jsonb NOT NULL,
  payload_bytes int GENERATED ALWAYS AS (octet_length(payload::text)) STORED,
  headers       jsonb NOT NULL DEFAULT '{}'::jsonb,
  traceparent   text,
  tracestate    text,
  created_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (id, tbl),
  CONSTRAINT outbox_log_id_names_its_table CHECK (tbl = (get_byte(uuid_send(id), 15) & 3)),
  CONSTRAINT outbox_log_topic_not_empty CHECK (topic <> ''),
  CONSTRAINT outbox_log_event_type_not_empty CHECK (event_type <> ''),
  CONSTRAINT outbox_log_headers_object CHECK (jsonb_typeof(headers) = 'object')
) PARTITION BY LIST (tbl);
-- Insert-only tables emptied by TRUNCATE: no vacuum is ever due (none is
-- started for inserts; there are no dead tuples to start one), and they are
-- truncated long before their xids need freezing. ANALYZE still runs.
CREATE TABLE bridge.outbox_log_0 PARTITION OF bridge.outbox_log FOR VALUES IN (0)
  WITH (autovacuum_vacuum_insert_threshold = -1);
CREATE TABLE bridge.outbox_log_1 PARTITION OF bridge.outbox_log FOR VALUES IN (1)
  WITH (autovacuum_vacuum_insert_threshold = -1);
CREATE TABLE bridge.outbox_log_2 PARTITION OF bridge.outbox_log FOR VALUES IN (2)
  WITH (autovacuum_vacuum_insert_threshold = -1);
CREATE TABLE bridge.outbox_log_3 PARTITION OF bridge.outbox_log FOR VALUES IN (3)
  WITH (autovacuum_vacuum_insert_threshold = -1);
-- Batches are read by xid (a range above the last position's xmax, and the
-- transactions its snapshot saw in progress), in (xid, seq) order.
CREATE INDEX outbox_log_xid ON bridge.outbox_log (xid, seq);
-- An asset's newest row (enqueue numbers the next event after it) and an
-- event's predecessor. Unique per table; the per-asset writer lock keeps it
-- unique across them.
CREATE UNIQUE INDEX outbox_log_0_asset_seq ON bridge.outbox_log_0 ((coalesce(asset_id, '')), asset_seq);
CREATE UNIQUE INDEX outbox_log_1_asset_seq ON bridge.outbox_log_1 ((coalesce(asset_id, '')), asset_seq);
CREATE UNIQUE INDEX outbox_log_2_asset_seq ON bridge.outbox_log_2 ((coalesce(asset_id, '')), asset_seq);
CREATE UNIQUE INDEX outbox_log_3_asset_seq ON bridge.outbox_log_3 ((coalesce(asset_id, '')), asset_seq);
-- +goose StatementEnd

-- +goose StatementBegin
-- The rotation: one row per table. current: the table new events go to;
-- since: when it became current; until: when it stopped being current (the
-- retention counts from there).
CREATE TABLE bridge.outbox_log_tables (
  tbl     smallint PRIMARY KEY CHECK (tbl BETWEEN 0 AND 3),
  current boolean NOT NULL,
  since   timestamptz,
  until   timestamptz
);
INSERT INTO bridge.outbox_log_tables (tbl, current, since, until)
VALUES (0, true, now(), NULL), (1, false, NULL, '-infinity'), (2, false, NULL, '-infinity'), (3, false, NULL, '-infinity');
-- +goose StatementEnd

-- +goose StatementBegin
-- Events the log has passed that did not go out with their batch: a row
-- whose send failed (attempts > 0), the later rows of its asset held behind
-- it (attempts 0), and parked rows (FAILED). A copy of the event, so that
-- the log's tables can be truncated whatever is held. A held row that goes
-- out becomes SENT here (its attempts and send time stay readable) and is
-- deleted after the retention.
CREATE TABLE bridge.outbox_held (
  id              uuid PRIMARY KEY,
  seq             bigint NOT NULL,
  asset_seq       bigint NOT NULL,
  topic           text NOT NULL,
  asset_id        text,
  lane            int NOT NULL,
  event_type      text NOT NULL,
  payload         jsonb NOT NULL,
  payload_bytes   int GENERATED ALWAYS AS (octet_length(payload::text)) STORED,
  headers         jsonb NOT NULL DEFAULT '{}'::jsonb,
  traceparent     text,
  tracestate      text,
  created_at      timestamptz NOT NULL,
  status          text NOT NULL DEFAULT 'NEW' CHECK (status IN ('NEW', 'SENT', 'FAILED')),
  attempts        int NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  last_error      text,
  failed_at       timestamptz,
  replayed_at     timestamptz,
  sent_at         timestamptz
);
-- A lane's held assets, each in order: the relay's hold and its retries.
CREATE INDEX outbox_held_new ON bridge.outbox_held (lane, (coalesce(asset_id, '')), asset_seq) WHERE status = 'NEW';
CREATE INDEX outbox_held_failed ON bridge.outbox_held (topic, failed_at) WHERE status = 'FAILED';
CREATE INDEX outbox_held_sent_at ON bridge.outbox_held (sent_at) WHERE status = 'SENT';
-- +goose StatementEnd

-- +goose StatementBegin
-- Each lane's position: the snapshot of the last batch it passed. Written by
-- the lane's owner only (fenced by its lease in bridge.relay_lanes). A table
-- of its own: the relay saves positions about once a second, and their old
-- versions must not slow the fence's reads of the leases while a held
-- snapshot keeps vacuum from removing them.
CREATE TABLE bridge.relay_positions (
  lane      int PRIMARY KEY, -- bridge.relay_lanes.lane
  tick      pg_snapshot NOT NULL, -- every event this snapshot sees was passed
  -- A batch read in part: of the events visible in batch_end and not in
  -- tick, those up to the key (after_xid, after_seq) were passed too.
  batch_end pg_snapshot,
  after_xid xid8,
  after_seq bigint
);
-- +goose StatementEnd

-- +goose StatementBegin
-- The upgrade: the old table's unsent rows into the log and the held table,
-- in seq order. This transaction's own rows are the first batch of every lane.
INSERT INTO bridge.outbox_log (tbl, id, seq, asset_seq, topic, asset_id, lane, event_type, payload, headers,
                               traceparent, tracestate, created_at)
SELECT get_byte(uuid_send(o.id), 15) & 3, o.id, o.seq, o.asset_seq, o.topic, o.asset_id, o.lane, o.event_type, o.payload,
       o.headers, o.traceparent, o.tracestate, o.created_at
FROM bridge.outbox o
WHERE o.status = 'NEW'
ORDER BY o.seq;
INSERT INTO bridge.outbox_held (id, seq, asset_seq, topic, asset_id, lane, event_type, payload, headers, traceparent,
                                tracestate, created_at, status, attempts, next_attempt_at, last_error, failed_at, replayed_at)
SELECT o.id, o.seq, o.asset_seq, o.topic, o.asset_id, o.lane, o.event_type, o.payload, o.headers, o.traceparent,
       o.tracestate, o.created_at, o.status, o.attempts, o.next_attempt_at, o.last_error, o.failed_at, o.replayed_at
FROM bridge.outbox o
WHERE o.status = 'FAILED' OR (o.status = 'NEW' AND o.attempts > 0)
ORDER BY o.seq;
-- Later NEW rows of an asset with a charged row wait behind it.
INSERT INTO bridge.outbox_held (id, seq, asset_seq, topic, asset_id, lane, event_type, payload, headers, traceparent,
                                tracestate, created_at)
SELECT o.id, o.seq, o.asset_seq, o.topic, o.asset_id, o.lane, o.event_type, o.payload, o.headers, o.traceparent,
       o.tracestate, o.created_at
FROM bridge.outbox o
WHERE o.status = 'NEW' AND o.attempts = 0
  AND EXISTS (SELECT 1 FROM bridge.outbox w
              WHERE coalesce(w.asset_id, '') = coalesce(o.asset_id, '') AND w.status = 'NEW' AND w.attempts > 0
                AND w.seq < o.seq)
ORDER BY o.seq;
-- Keep every asset's number (the old rows leave).
INSERT INTO bridge.asset_counters AS c (asset_key, last_asset_seq)
SELECT coalesce(asset_id, ''), max(asset_seq) FROM bridge.outbox GROUP BY 1 ORDER BY 1
ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = excluded.last_asset_seq
  WHERE c.last_asset_seq < excluded.last_asset_seq;
-- Every lane has passed everything committed before this transaction, and
-- not this transaction's rows.
INSERT INTO bridge.relay_positions (lane, tick)
SELECT lane, (pg_current_xact_id()::text || ':' || pg_current_xact_id()::text || ':')::pg_snapshot
FROM bridge.relay_lanes;
-- +goose StatementEnd

-- +goose StatementBegin
DROP TABLE bridge.outbox;
DROP FUNCTION bridge.keep_last_asset_seq();
DROP FUNCTION bridge.keep_last_asset_seq_before_truncate();
DROP FUNCTION bridge.outbox_hold_inflight();
DROP FUNCTION bridge.relay_inflight_floor();
DROP FUNCTION bridge.outbox_seq_position();
-- +goose StatementEnd

-- +goose StatementBegin
-- At commit, wake relays that wait for work (migration 00160's rules,
-- unchanged), once per transaction.
CREATE CONSTRAINT TRIGGER outbox_log_wake AFTER INSERT ON bridge.outbox_log
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (bridge.outbox_first_row_of_transaction())
EXECUTE FUNCTION bridge.outbox_wake_on_commit();
-- +goose StatementEnd

-- +goose StatementBegin
-- Whether a lane's position (a row of bridge.relay_positions) has passed the
-- event (x, seq).
CREATE FUNCTION bridge.outbox_passed(x xid8, seq bigint, p bridge.relay_positions) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT p.tick IS NOT NULL AND (
    pg_visible_in_snapshot(x, p.tick)
    OR (p.batch_end IS NOT NULL AND pg_visible_in_snapshot(x, p.batch_end) AND (x, seq) <= (p.after_xid, p.after_seq)))
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- What operators, tests and applications read: one row per event, as the
-- table was. A held row is what it says (NEW or FAILED); a log row is SENT
-- once its lane has passed it and NEW before. sent_at is recorded only for
-- rows that went out from bridge.outbox_held; kafka_partition and
-- kafka_offset are not recorded any more (always NULL).
CREATE VIEW bridge.outbox AS
SELECT l.id, l.seq, l.asset_seq, l.topic, l.asset_id, l.lane, l.event_type, l.payload, l.payload_bytes, l.headers,
       l.traceparent, l.tracestate,
       coalesce(h.status, CASE WHEN bridge.outbox_passed(l.xid, l.seq, rl) THEN 'SENT' ELSE 'NEW' END) AS status,
       coalesce(h.attempts, 0) AS attempts, coalesce(h.next_attempt_at, l.created_at) AS next_attempt_at,
       h.last_error, l.created_at, h.sent_at, h.failed_at, h.replayed_at,
       NULL::int AS kafka_partition, NULL::bigint AS kafka_offset
FROM bridge.outbox_log l
LEFT JOIN bridge.outbox_held h ON h.id = l.id
LEFT JOIN bridge.relay_positions rl ON rl.lane = l.lane
UNION ALL
SELECT h.id, h.seq, h.asset_seq, h.topic, h.asset_id, h.lane, h.event_type, h.payload, h.payload_bytes, h.headers,
       h.traceparent, h.tracestate, h.status, h.attempts, h.next_attempt_at, h.last_error, h.created_at,
       h.sent_at, h.failed_at, h.replayed_at, NULL::int, NULL::bigint
FROM bridge.outbox_held h
WHERE NOT EXISTS (SELECT 1 FROM bridge.outbox_log l WHERE l.id = h.id AND l.tbl = get_byte(uuid_send(h.id), 15) & 3);
-- +goose StatementEnd

-- +goose StatementBegin
-- Writes through the view, for operators' repairs and tests: a change of
-- status, attempts, error or times is written to the row's copy in
-- bridge.outbox_held (made if needed); created_at is written to the log row.
-- DELETE removes the event from both. (The relay never writes through it.)
CREATE FUNCTION bridge.outbox_view_write() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  IF TG_OP = 'DELETE' THEN
    DELETE FROM bridge.outbox_held WHERE id = OLD.id;
    DELETE FROM bridge.outbox_log WHERE id = OLD.id AND tbl = get_byte(uuid_send(OLD.id), 15) & 3;
    RETURN OLD;
  END IF;
  IF NEW.created_at IS DISTINCT FROM OLD.created_at THEN
    UPDATE bridge.outbox_log SET created_at = NEW.created_at WHERE id = OLD.id AND tbl = get_byte(uuid_send(OLD.id), 15) & 3;
    UPDATE bridge.outbox_held SET created_at = NEW.created_at WHERE id = OLD.id;
  END IF;
  IF NEW.status IS DISTINCT FROM OLD.status OR NEW.attempts IS DISTINCT FROM OLD.attempts
     OR NEW.last_error IS DISTINCT FROM OLD.last_error OR NEW.failed_at IS DISTINCT FROM OLD.failed_at
     OR NEW.next_attempt_at IS DISTINCT FROM OLD.next_attempt_at OR NEW.sent_at IS DISTINCT FROM OLD.sent_at
     OR NEW.replayed_at IS DISTINCT FROM OLD.replayed_at THEN
    INSERT INTO bridge.outbox_held AS h (id, seq, asset_seq, topic, asset_id, lane, event_type, payload, headers, traceparent,
                                         tracestate, created_at, status, attempts, next_attempt_at, last_error, failed_at,
                                         replayed_at, sent_at)
    VALUES (OLD.id, OLD.seq, OLD.asset_seq, OLD.topic, OLD.asset_id, OLD.lane, OLD.event_type, OLD.payload, OLD.headers,
            OLD.traceparent, OLD.tracestate, NEW.created_at, NEW.status, NEW.attempts, NEW.next_attempt_at, NEW.last_error,
            NEW.failed_at, NEW.replayed_at, CASE WHEN NEW.status = 'SENT' THEN coalesce(NEW.sent_at, now()) END)
    ON CONFLICT (id) DO UPDATE SET status = excluded.status, attempts = excluded.attempts,
      next_attempt_at = excluded.next_attempt_at, last_error = excluded.last_error, failed_at = excluded.failed_at,
      replayed_at = excluded.replayed_at, sent_at = excluded.sent_at;
  END IF;
  RETURN NEW;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER outbox_view_write INSTEAD OF UPDATE OR DELETE ON bridge.outbox
FOR EACH ROW EXECUTE FUNCTION bridge.outbox_view_write();
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
  v_tbl int;
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
  IF v_traceparent IS NOT NULL AND NOT bridge.traceparent_ok(v_traceparent) THEN
    RAISE WARNING 'bridge.enqueue: dropping malformed traceparent %', quote_literal(v_traceparent);
    v_traceparent := NULL;
    v_tracestate := NULL;
  END IF;

  -- Serialise this asset's writers until commit: lock its counter row,
  -- creating it at 0 the first time, without writing a new version of it.
  INSERT INTO bridge.asset_counters AS c (asset_key, last_asset_seq)
  VALUES (v_asset_key, 0)
  ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = c.last_asset_seq WHERE false;
  -- A new statement, so a new snapshot: it sees what the writer this one
  -- waited for committed. The asset's last asset_seq is its newest log row
  -- (one step down each table's asset index), or the counter, which keeps
  -- it once that row's table is truncated.
  SELECT greatest(
           (SELECT c.last_asset_seq FROM bridge.asset_counters c WHERE c.asset_key = v_asset_key),
           (SELECT o.asset_seq FROM bridge.outbox_log o
            WHERE coalesce(o.asset_id, '') = v_asset_key
            ORDER BY coalesce(o.asset_id, '') DESC, o.asset_seq DESC
            LIMIT 1)) + 1,
         (SELECT t.tbl FROM bridge.outbox_log_tables t WHERE t.current)
  INTO v_asset_seq, v_tbl;

  INSERT INTO bridge.outbox_log AS o (tbl, id, asset_seq, topic, asset_id, lane, event_type, payload, headers, traceparent, tracestate)
  VALUES (v_tbl, bridge.outbox_log_id(v_tbl), v_asset_seq, enqueue.topic, nullif(enqueue.asset_id, ''), bridge.lane_of(v_asset_key),
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
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
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

  -- bridge.enqueue's checks, the first failing event named.
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
  FOR v_bad IN
    SELECT u.tp FROM unnest(traceparents) AS u(tp) WHERE u.tp IS NOT NULL AND NOT bridge.traceparent_ok(u.tp)
  LOOP
    RAISE WARNING 'bridge.enqueue_batch: dropping malformed traceparent %', quote_literal(v_bad);
  END LOOP;

  -- Serialise each asset's writers until commit, in key order.
  INSERT INTO bridge.asset_counters AS c (asset_key, last_asset_seq)
  SELECT DISTINCT coalesce(a, ''), 0 FROM unnest(asset_ids) AS a ORDER BY 1
  ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = c.last_asset_seq WHERE false;

  -- A new statement, so a new snapshot: each asset's events continue after
  -- its newest log row or its counter, in array order; rows are inserted
  -- (and take their seq) in array order.
  RETURN QUERY
  WITH ev AS (
    SELECT u.ord, u.t, nullif(u.a, '') AS a, coalesce(u.a, '') AS k, u.e, u.p, coalesce(u.h, '{}'::jsonb) AS h,
           CASE WHEN bridge.traceparent_ok(u.tp) THEN u.tp END AS tp,
           CASE WHEN bridge.traceparent_ok(u.tp) THEN u.ts END AS ts
    FROM unnest(topics, asset_ids, event_types, payloads, headers, traceparents, tracestates)
         WITH ORDINALITY AS u(t, a, e, p, h, tp, ts, ord)
  ),
  cur AS (SELECT t.tbl FROM bridge.outbox_log_tables t WHERE t.current),
  last AS (
    SELECT d.k, coalesce(greatest(
             (SELECT c.last_asset_seq FROM bridge.asset_counters c WHERE c.asset_key = d.k),
             (SELECT o.asset_seq FROM bridge.outbox_log o
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
    INSERT INTO bridge.outbox_log AS o (tbl, id, asset_seq, topic, asset_id, lane, event_type, payload, headers, traceparent, tracestate)
    SELECT cur.tbl, bridge.outbox_log_id(cur.tbl), x.asset_seq, x.t, x.a, bridge.lane_of(x.k), x.e, x.p, x.h, x.tp, x.ts
    FROM numbered x CROSS JOIN cur
    ORDER BY x.ord
    RETURNING o.id, o.seq
  )
  SELECT ins.id FROM ins ORDER BY ins.seq;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
-- One step of the rotation (bridge.outbox_log_tables): the table after the
-- current one is emptied and becomes current. It is emptied only if, under
-- an ACCESS EXCLUSIVE lock (no transaction can be inserting into it any
-- more, and one that still may is waited for, at most lock_ms), every row in
-- it has been passed by its lane and its table stopped being current at
-- least retention ago. Each asset whose newest row it holds keeps its
-- number in bridge.asset_counters first. Returns the new current table, or
-- NULL when nothing rotated (the lock was not granted in time, a lane has
-- not passed a row, or the retention has not elapsed).
CREATE FUNCTION bridge.outbox_log_rotate(retention interval, lock_ms int) RETURNS int
LANGUAGE plpgsql AS $fn$
DECLARE
  v_cur int;
  v_next int;
  v_until timestamptz;
  v_table text;
  v_pending boolean;
BEGIN
  SELECT t.tbl INTO v_cur FROM bridge.outbox_log_tables t WHERE t.current FOR UPDATE;
  v_next := (v_cur + 1) % 4;
  SELECT t.until INTO v_until FROM bridge.outbox_log_tables t WHERE t.tbl = v_next FOR UPDATE;
  IF v_until IS NULL OR v_until > now() - retention THEN
    RETURN NULL;
  END IF;
  v_table := 'bridge.outbox_log_' || v_next;
  PERFORM set_config('lock_timeout', lock_ms || 'ms', true);
  BEGIN
    EXECUTE 'LOCK TABLE ' || v_table || ' IN ACCESS EXCLUSIVE MODE';
  EXCEPTION WHEN lock_not_available THEN
    RETURN NULL;
  END;
  PERFORM set_config('lock_timeout', '0', true);
  EXECUTE format($q$
    SELECT EXISTS (
      SELECT 1 FROM %s l LEFT JOIN bridge.relay_positions rl ON rl.lane = l.lane
      WHERE l.xid >= (SELECT coalesce(min(pg_snapshot_xmin(tick)), '0'::text::xid8) FROM bridge.relay_positions)
        AND NOT bridge.outbox_passed(l.xid, l.seq, rl))$q$, v_table) INTO v_pending;
  IF v_pending THEN
    RETURN NULL;
  END IF;
  EXECUTE format($q$
    INSERT INTO bridge.asset_counters AS c (asset_key, last_asset_seq)
    SELECT d.k, d.s FROM (SELECT coalesce(asset_id, '') AS k, max(asset_seq) AS s FROM %s GROUP BY 1) d
    WHERE NOT EXISTS (SELECT 1 FROM bridge.outbox_log o WHERE coalesce(o.asset_id, '') = d.k AND o.asset_seq > d.s)
    ORDER BY d.k
    ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = excluded.last_asset_seq
      WHERE c.last_asset_seq < excluded.last_asset_seq$q$, v_table);
  EXECUTE 'TRUNCATE ' || v_table;
  UPDATE bridge.outbox_log_tables t
  SET current = (t.tbl = v_next),
      since = CASE WHEN t.tbl = v_next THEN now() ELSE t.since END,
      until = CASE WHEN t.tbl = v_cur THEN now() WHEN t.tbl = v_next THEN NULL ELSE t.until END
  WHERE t.tbl IN (v_cur, v_next);
  RETURN v_next;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$ BEGIN
  RAISE EXCEPTION 'migration 00230 (the outbox log) is not reversible: the log keeps no per-event send status to rebuild the old table from; restore a backup taken before it';
END $$;
-- +goose StatementEnd
