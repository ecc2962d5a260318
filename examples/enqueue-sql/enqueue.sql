-- The smallest application that publishes through Outbox Bridge, in plain
-- SQL: a change of the application's own and the events that announce it,
-- in one transaction. Any language that runs SQL does the same.
--
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -v asset=asset-42 -f examples/enqueue-sql/enqueue.sql
--
-- The database must be migrated (bridge migrate; make demo does it).

CREATE TABLE IF NOT EXISTS example_assets (id text PRIMARY KEY, version int NOT NULL);

BEGIN;
INSERT INTO example_assets (id, version) VALUES (:'asset', 1)
  ON CONFLICT (id) DO UPDATE SET version = example_assets.version + 1;

-- bridge.enqueue(topic, asset_id, event_type, payload
--                [, headers jsonb, traceparent text, tracestate text])
-- returns the event's id. Events of one asset reach Kafka and every
-- subscriber in the order they were enqueued.
SELECT bridge.enqueue('assets', :'asset', 'asset.version_published',
                      jsonb_build_object('version', version))
  FROM example_assets WHERE id = :'asset';
COMMIT;
