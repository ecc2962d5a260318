-- Why this exists: the writers' functions were planned again on every call.
-- A profile of the whole machine at 1,000 events/s (8 writers, 3 events a
-- transaction, on this project's 2-core test machine) had a quarter of
-- PostgreSQL's CPU in the planner and a sixth in SQL-language functions:
--
-- - bridge.enqueue_batch's statements take arrays as parameters, and
--   PL/pgSQL's plan cache kept choosing a custom plan for them — a fresh plan
--   of the CTE-heavy INSERT on every call (~0.3 ms of a 0.66 ms call). No
--   plan choice in them depends on the arrays' contents: every table access
--   is an index lookup by a correlated key (the asset's counter row, its
--   newest outbox row), whatever the statistics, even on an empty table; the
--   arrays only size the in-memory steps (a 2,000-event call runs in the same
--   time either way). So the function plans them once per session.
-- - A SQL-language function that the planner does not inline is parsed and
--   planned again for every statement (or PL/pgSQL transaction) that calls
--   it: bridge.topic_name_problem (once per event, ~21 µs), and per commit
--   bridge.outbox_seq_position (~30 µs, from the in-flight trigger) and
--   bridge.wake_relays (~29 µs, from the wake-up trigger). As PL/pgSQL they
--   keep their plans for the session. Their results are unchanged.
--
-- Measured with pgbench (4 clients, synchronous_commit off so the CPU is
-- the limit, bridge.enqueue_batch of 3 events a transaction, alternated):
-- 1,971 / 2,162 transactions/s before this migration, 4,128 / 4,066 after
-- it (docs/benchmarks.md). The Down section restores
-- the previous bodies as they were.

-- +goose Up
-- +goose StatementBegin
ALTER FUNCTION bridge.enqueue_batch(text[], text[], text[], jsonb[], jsonb[], text[], text[])
  SET plan_cache_mode = force_generic_plan;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION bridge.topic_name_problem(topic text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
BEGIN
  RETURN CASE
    WHEN topic IS NULL OR topic = '' THEN 'it must not be empty'
    WHEN length(topic) > 249 THEN 'it is ' || length(topic) || ' characters long; at most 249 are allowed'
    WHEN topic IN ('.', '..') THEN '''.'' and ''..'' are not allowed'
    WHEN topic !~ '^[a-zA-Z0-9._-]+$' THEN 'only ASCII letters, digits, ''.'', ''_'' and ''-'' are allowed'
    WHEN starts_with(topic, '__') THEN 'names starting with ''__'' are reserved for Kafka''s internal topics'
  END;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION bridge.outbox_seq_position() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  RETURN (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM bridge.outbox_seq_seq);
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION bridge.wake_relays(from_seq bigint) RETURNS bigint
LANGUAGE plpgsql STRICT VOLATILE AS $fn$
BEGIN
  PERFORM pg_notify('bridge_outbox', from_seq::text);
  RETURN from_seq;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
ALTER FUNCTION bridge.enqueue_batch(text[], text[], text[], jsonb[], jsonb[], text[], text[])
  RESET plan_cache_mode;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION bridge.topic_name_problem(topic text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE
    WHEN topic IS NULL OR topic = '' THEN 'it must not be empty'
    WHEN length(topic) > 249 THEN 'it is ' || length(topic) || ' characters long; at most 249 are allowed'
    WHEN topic IN ('.', '..') THEN '''.'' and ''..'' are not allowed'
    WHEN topic !~ '^[a-zA-Z0-9._-]+$' THEN 'only ASCII letters, digits, ''.'', ''_'' and ''-'' are allowed'
    WHEN starts_with(topic, '__') THEN 'names starting with ''__'' are reserved for Kafka''s internal topics'
  END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION bridge.outbox_seq_position() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM bridge.outbox_seq_seq
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION bridge.wake_relays(from_seq bigint) RETURNS bigint
LANGUAGE sql STRICT VOLATILE AS $$
  SELECT pg_notify('bridge_outbox', from_seq::text);
  SELECT from_seq;
$$;
-- +goose StatementEnd
