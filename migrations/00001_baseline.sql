-- The baseline schema of the bridge, one section per table, each with the
-- failure modes that shaped it (docs/failure-modes.md has them with the tests
-- that prove them). Later migrations are appended as new numbered files and
-- never edit this one.
--
-- Why the schema exists at all: an application must be able to record "this
-- happened" in the same transaction as the change itself. Emitting after COMMIT
-- loses events when the process dies between the two; emitting before COMMIT
-- announces changes that may still roll back. bridge.outbox is the table that
-- transaction writes to, and bridge.enqueue() is the one call any language uses
-- to write it. The relay moves its rows to Kafka, the consumer turns Kafka
-- records into bridge.deliveries, and the deliverer sends those as webhooks.

-- +goose Up
-- +goose StatementBegin
CREATE SCHEMA IF NOT EXISTS bridge;

-- Relay lanes ----------------------------------------------------------------

-- Number of relay lanes. An asset always hashes to the same lane, and a lane is
-- leased to exactly one relay replica at a time (bridge.relay_lanes), so one
-- asset's events are only ever produced by one replica. Changing it would move
-- assets between lanes while rows are in flight: it is fixed by migration, not
-- config.
CREATE FUNCTION bridge.lane_count() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 64 $$;

-- The lane of an asset key ('' is the null-asset stream).
CREATE FUNCTION bridge.lane_of(asset_key text) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT ((hashtextextended(asset_key, 0) & 2147483647) % bridge.lane_count())::int
$$;

-- bridge.asset_counters --------------------------------------------------------

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

-- bridge.outbox ----------------------------------------------------------------

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
  -- Every failed send that belongs to the row is counted, so a row that can
  -- never be sent is parked as FAILED after RELAY_MAX_ATTEMPTS instead of being
  -- retried forever while everything behind it piles up.
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

-- A topic name Kafka refuses would commit with the application's change and
-- then never be produced (parked FAILED long after, where nobody who could fix
-- it is looking), so bridge.enqueue refuses it in the caller's transaction.
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

-- bridge.relay_lanes, bridge.relay_members -------------------------------------

-- With several relay replicas, SKIP LOCKED alone breaks per-asset order:
-- replica A claims asset X's rows 5 and 6, replica B skips the locked ones,
-- claims X's row 7 and produces it first. Assets are therefore hashed onto a
-- fixed set of lanes (bridge.lane_of) and each lane is leased to one replica at
-- a time. A replica claims only rows of lanes it holds, and every statement that
-- marks rows checks that it still holds the lease (fencing): a replica that
-- stalled past its lease may still finish produce requests that were in flight
-- — harmless duplicates with the same dedup-id — but it can no longer mark rows
-- that now belong to someone else.
CREATE TABLE bridge.relay_lanes (
  lane        int PRIMARY KEY,
  owner       text,                   -- relay replica id; NULL when free
  epoch       bigint NOT NULL DEFAULT 0, -- bumped on every change of owner
  expires_at  timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO bridge.relay_lanes (lane)
SELECT g FROM generate_series(0, bridge.lane_count() - 1) g;

-- Live replicas, so each can compute its fair share of lanes and take over
-- only what must move when one joins or leaves.
CREATE TABLE bridge.relay_members (
  member_id    text PRIMARY KEY,
  hostname     text NOT NULL DEFAULT '',
  started_at   timestamptz NOT NULL DEFAULT now(),
  heartbeat_at timestamptz NOT NULL DEFAULT now(),
  expires_at   timestamptz NOT NULL
);

-- The delivery half ------------------------------------------------------------
--
-- Every rule below is a failure mode of webhook delivery: deliveries carry a seq
-- taken at insert so one (subscription, asset) stream keeps Kafka's partition
-- order; a claim hands out only the head of a stream; the consumer inbox makes a
-- redelivered Kafka record add nothing; the attempt log never holds payloads.

-- bridge.subscriptions ---------------------------------------------------------

CREATE TABLE bridge.subscriptions (
  id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  url                  text NOT NULL,
  description          text NOT NULL DEFAULT '',
  -- Exact event types and 'prefix.*' wildcards; '*' matches everything.
  event_types          text[] NOT NULL,
  topic                text,            -- optional: only events from this topic
  enabled              boolean NOT NULL DEFAULT true,
  disabled_reason      text,
  disabled_at          timestamptz,
  -- Moves only when a delivery dies (one payload the endpoint chokes on cannot
  -- disable a healthy endpoint); any success resets it: "consecutive" is the
  -- whole meaning of the column.
  consecutive_failures int NOT NULL DEFAULT 0,
  created_at           timestamptz NOT NULL DEFAULT now(),
  updated_at           timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT subscriptions_event_types_not_empty CHECK (cardinality(event_types) > 0)
);

-- bridge.subscription_secrets --------------------------------------------------

-- Signing secrets. Rotation adds a new secret and gives the previous one an
-- expiry (WEBHOOK_SECRET_GRACE): until then both sign every request, so a
-- receiver can switch secrets without rejecting a single delivery.
CREATE TABLE bridge.subscription_secrets (
  id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  subscription_id uuid NOT NULL REFERENCES bridge.subscriptions (id) ON DELETE CASCADE,
  secret          text NOT NULL,         -- 'whsec_' + base64(>= 24 random bytes)
  created_at      timestamptz NOT NULL DEFAULT now(),
  expires_at      timestamptz            -- NULL: current secret
);
CREATE INDEX subscription_secrets_by_subscription ON bridge.subscription_secrets (subscription_id);

-- bridge.consumer_inbox --------------------------------------------------------

-- Consumer inbox: one row per Kafka record turned into deliveries, written in
-- the same transaction as those deliveries. A record seen again (redelivery
-- after a crash before the offset commit, or a duplicate produce) conflicts
-- here and adds nothing.
CREATE TABLE bridge.consumer_inbox (
  dedup_id        text PRIMARY KEY,      -- dedup-id header, or topic/partition/offset
  topic           text NOT NULL,
  kafka_partition int NOT NULL,
  kafka_offset    bigint NOT NULL,
  received_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX consumer_inbox_received_at ON bridge.consumer_inbox (received_at);

-- bridge.deliveries ------------------------------------------------------------

CREATE TABLE bridge.deliveries (
  id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  -- Taken at insert, in Kafka partition order: the order of a
  -- (subscription, asset) stream.
  seq              bigserial UNIQUE,
  subscription_id  uuid NOT NULL REFERENCES bridge.subscriptions (id) ON DELETE CASCADE,
  event_id         text NOT NULL,        -- the dedup id: webhook-id on every attempt
  event_type       text NOT NULL,
  topic            text NOT NULL,
  asset_id         text,                 -- NULL: the null-asset stream
  asset_seq        bigint,
  payload          jsonb NOT NULL,
  event_created_at timestamptz NOT NULL,
  traceparent      text,
  tracestate       text,
  status           text NOT NULL DEFAULT 'pending',
  attempts         int NOT NULL DEFAULT 0,
  next_attempt_at  timestamptz NOT NULL DEFAULT now(),
  lease_expires_at timestamptz,
  claimed_by       text,
  last_error       text,
  last_status_code int,
  created_at       timestamptz NOT NULL DEFAULT now(),
  delivered_at     timestamptz,
  dead_at          timestamptz,
  revived_at       timestamptz,
  CONSTRAINT deliveries_status_valid CHECK (status IN ('pending', 'delivering', 'delivered', 'dead')),
  CONSTRAINT deliveries_once_per_subscription UNIQUE (subscription_id, event_id)
);
-- Stream heads: "is there an earlier undelivered delivery of this
-- (subscription, asset)?" is one probe on this index, so the claim's cost stays
-- proportional to the batch and not to the backlog.
CREATE INDEX deliveries_open_by_stream ON bridge.deliveries (subscription_id, (coalesce(asset_id, '')), seq)
  WHERE status IN ('pending', 'delivering');
CREATE INDEX deliveries_pending_due ON bridge.deliveries (subscription_id, seq) WHERE status = 'pending';
CREATE INDEX deliveries_delivering_lease ON bridge.deliveries (lease_expires_at) WHERE status = 'delivering';
CREATE INDEX deliveries_by_subscription_status ON bridge.deliveries (subscription_id, status, id);
-- The claim's second sibling probe — "is anything of this (subscription, asset)
-- stream in flight?" — had only deliveries_open_by_stream to use, which holds
-- every pending row too, so the probe walked the stream's whole backlog: a
-- claim cost O(backlog), about 90 ms for 32 rows over a 20,000-row backlog
-- (docs/failure-modes.md §6). In-flight rows are few (at most one per stream),
-- so a partial index on them keeps the probe one lookup. The probe is needed
-- because revive reopens a dead row in front of a stream whose later row may be
-- in flight.
CREATE INDEX deliveries_in_flight_by_stream ON bridge.deliveries (subscription_id, (coalesce(asset_id, '')))
  WHERE status = 'delivering';
-- Delivered deliveries and their attempt logs would otherwise be kept forever,
-- so bridge.deliveries would grow with the traffic and every index with it (the
-- claim's partial indexes stay small, but the heap, the log queries and vacuum
-- do not). The deliverer deletes delivered rows older than WEBHOOK_RETENTION in
-- bounded batches (attempts go with them, ON DELETE CASCADE); this index makes
-- each batch a range scan of the oldest delivered rows instead of a scan of the
-- table. Dead deliveries are kept: an operator may still revive them.
CREATE INDEX deliveries_delivered_at ON bridge.deliveries (delivered_at) WHERE status = 'delivered';

-- Wake the delivery workers when the consumer commits new deliveries.
CREATE FUNCTION bridge.notify_deliveries() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pg_notify('bridge_deliveries', '');
  RETURN NULL;
END
$fn$;
CREATE TRIGGER deliveries_notify AFTER INSERT ON bridge.deliveries
FOR EACH STATEMENT EXECUTE FUNCTION bridge.notify_deliveries();

-- bridge.delivery_streams ------------------------------------------------------

-- Without this table the delivery claim walked pending deliveries in seq order
-- and probed each for "is an earlier one of its stream open?". One stream whose
-- head waits for a retry (or is in flight to a slow endpoint) puts all its later
-- rows in front of every other stream's head, so each claim probed them all:
-- with 20,000 rows behind one failing asset a claim took ~640 ms, and since
-- claims are serial, one bad endpoint slowed delivery to every subscriber
-- (docs/failure-modes.md §6).
--
-- bridge.delivery_streams has one row per (subscription, asset) stream that has
-- ever had a delivery, with ready_at: when the claim should look at it next.
-- The claim reads only streams that are ready now, so its cost follows the
-- batch, not the backlog. The table is a hint, never the authority: the claim
-- still finds each stream's head in bridge.deliveries and checks it under the
-- row lock, so a stale ready_at can cost a wasted probe but never order. What
-- must not happen is a stream with a claimable head and ready_at in the future
-- (it would never be claimed): the claim parks a stream (head waiting for a
-- retry, or no open row) only if gen is still what it read, and the two things
-- that can wake a parked stream — an insert and a revive — bump gen. See
-- claimSQL in internal/delivery/store/claim.go.
CREATE TABLE bridge.delivery_streams (
  subscription_id uuid NOT NULL REFERENCES bridge.subscriptions (id) ON DELETE CASCADE,
  asset_key       text NOT NULL,          -- coalesce(asset_id, ''): the null asset is one stream
  ready_at        timestamptz NOT NULL,   -- 'infinity': nothing to do until something changes
  gen             bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (subscription_id, asset_key)
);
CREATE INDEX delivery_streams_ready ON bridge.delivery_streams (subscription_id, ready_at);

-- New deliveries make their stream ready (at the earliest of what it had and
-- the new row's next_attempt_at). One statement-level trigger per INSERT or
-- COPY, so a consumer batch costs one upsert per stream, not per row. The
-- upsert also locks the stream row until the inserting transaction commits,
-- which is what keeps a concurrent claim's gen check honest.
--
-- The streams are upserted in (subscription_id, asset_key) order, the order in
-- which every writer of several stream rows takes them: two transactions
-- inserting deliveries for the same streams in different orders (two consumers,
-- or a consumer and a revive) would otherwise deadlock on the stream rows.
CREATE FUNCTION bridge.delivery_streams_on_insert() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO bridge.delivery_streams AS st (subscription_id, asset_key, ready_at)
  SELECT n.subscription_id, coalesce(n.asset_id, ''), min(n.next_attempt_at)
  FROM new_rows n
  WHERE n.status IN ('pending', 'delivering')
  GROUP BY 1, 2
  ORDER BY 1, 2
  ON CONFLICT (subscription_id, asset_key) DO UPDATE
    SET ready_at = least(st.ready_at, excluded.ready_at), gen = st.gen + 1;
  RETURN NULL;
END
$fn$;
CREATE TRIGGER deliveries_streams AFTER INSERT ON bridge.deliveries
REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION bridge.delivery_streams_on_insert();

-- bridge.delivery_attempts -----------------------------------------------------

-- One row per HTTP attempt. Never the payload: the log is the most-run query
-- and the cheapest way to read a tenant's whole history if it held one.
CREATE TABLE bridge.delivery_attempts (
  id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  delivery_id   bigint NOT NULL REFERENCES bridge.deliveries (id) ON DELETE CASCADE,
  attempt       int NOT NULL,
  started_at    timestamptz NOT NULL,
  duration_ms   double precision NOT NULL,
  status_code   int,                     -- NULL when no response arrived
  error         text,
  response_body text,                    -- first 1 KiB
  trace_id      text
);
CREATE INDEX delivery_attempts_by_delivery ON bridge.delivery_attempts (delivery_id, attempt);
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
-- The baseline owns the whole schema; going below it means starting over.
DROP SCHEMA bridge CASCADE;
-- +goose StatementEnd
