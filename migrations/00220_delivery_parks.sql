-- +goose Up
-- +goose StatementBegin

-- The fast lane delivers straight from the Kafka partitions it owns; a
-- (subscription, asset) stream whose head fails is parked in
-- bridge.deliveries, where the claim, the retry schedule, dead letters and
-- revive serve it (the slow lane). bridge.delivery_parks has one row per
-- parked stream: while it exists, every later event of the stream goes behind
-- the stream's rows in bridge.deliveries instead of to the endpoint, so the
-- hand-over between the lanes never reorders (docs/architecture.md, "The
-- hand-over").
--
-- Who writes a marker:
--  * any INSERT of open deliveries (the fast lane's park and append, the
--    pipeline's fan-out, recover, subscription history): the insert trigger
--    below upserts the stream's marker and holds its row lock until COMMIT;
--  * revive and every other UPDATE that reopens a row: the settle trigger;
--  * the settle of a stream's last open row (delivered or dead) deletes it,
--    in the same transaction, unless another transaction holds the marker —
--    one that holds it is adding rows to the stream (SKIP LOCKED: the slow
--    lane never waits on the fast lane, so the two cannot deadlock).
-- A marker left without open rows (its appender rolled back) costs the
-- stream a detour through the slow lane until the sweep (or the stream's
-- next settle) deletes it; it never costs order.
CREATE TABLE bridge.delivery_parks (
  subscription_id uuid NOT NULL REFERENCES bridge.subscriptions (id) ON DELETE CASCADE,
  asset_key       text NOT NULL,          -- coalesce(asset_id, ''): the null asset is one stream
  topic           text NOT NULL,
  -- Where the fast lane parked it (NULL: parked by a writer that did not
  -- read it from Kafka — the upgrade, recover, revive, history).
  kafka_partition int,
  kafka_offset    bigint,
  parked_at       timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (subscription_id, asset_key)
);

CREATE FUNCTION bridge.delivery_parks_on_insert() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  -- DO UPDATE, not DO NOTHING: the row lock held until COMMIT is what makes
  -- a concurrent settle of the stream's last row leave the marker in place.
  INSERT INTO bridge.delivery_parks AS p (subscription_id, asset_key, topic)
  SELECT n.subscription_id, coalesce(n.asset_id, ''), min(n.topic)
  FROM new_rows n
  WHERE n.status IN ('pending', 'delivering')
  GROUP BY 1, 2
  ORDER BY 1, 2
  ON CONFLICT (subscription_id, asset_key) DO UPDATE SET topic = p.topic;
  RETURN NULL;
END
$fn$;
CREATE TRIGGER deliveries_parks_insert AFTER INSERT ON bridge.deliveries
REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION bridge.delivery_parks_on_insert();

-- A row settled (delivered or dead) or reopened (revive: dead → pending).
-- Row-level and only on those transitions, so the claim, a retry and a
-- release (which keep the row open) never run it, and no statement copies
-- its rows (payloads included) into transition tables for it. After-row
-- triggers fire at the end of the statement, so the check below sees every
-- row the statement changed.
CREATE FUNCTION bridge.delivery_parks_on_settle() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  IF NEW.status IN ('pending', 'delivering') THEN
    -- Reopened: the stream is parked again.
    INSERT INTO bridge.delivery_parks AS p (subscription_id, asset_key, topic)
    VALUES (NEW.subscription_id, coalesce(NEW.asset_id, ''), NEW.topic)
    ON CONFLICT (subscription_id, asset_key) DO UPDATE SET topic = p.topic;
    RETURN NULL;
  END IF;
  -- Settled: if it was its stream's last open row, the stream goes back to
  -- the fast lane. A marker another transaction holds is left alone: that
  -- transaction is adding rows to the stream. The EXISTS runs on a fresh
  -- snapshot (a volatile function under READ COMMITTED) taken after the
  -- lock, so it sees every row an appender committed before letting go of
  -- the marker.
  PERFORM 1 FROM bridge.delivery_parks p
  WHERE p.subscription_id = NEW.subscription_id AND p.asset_key = coalesce(NEW.asset_id, '')
  FOR UPDATE SKIP LOCKED;
  IF FOUND AND NOT EXISTS (
      SELECT 1 FROM bridge.deliveries d
      WHERE d.subscription_id = NEW.subscription_id AND coalesce(d.asset_id, '') = coalesce(NEW.asset_id, '')
        AND d.status IN ('pending', 'delivering')) THEN
    DELETE FROM bridge.delivery_parks
    WHERE subscription_id = NEW.subscription_id AND asset_key = coalesce(NEW.asset_id, '');
  END IF;
  RETURN NULL;
END
$fn$;
CREATE TRIGGER deliveries_parks_settle AFTER UPDATE OF status ON bridge.deliveries
FOR EACH ROW
WHEN (OLD.status IS DISTINCT FROM NEW.status
      AND (NEW.status IN ('delivered', 'dead') OR OLD.status IN ('delivered', 'dead')))
EXECUTE FUNCTION bridge.delivery_parks_on_settle();

-- An installation upgraded with deliveries still open: each of their streams
-- is parked, so the fast lane queues behind them and the slow lane serves
-- them as before.
INSERT INTO bridge.delivery_parks (subscription_id, asset_key, topic)
SELECT d.subscription_id, coalesce(d.asset_id, ''), min(d.topic)
FROM bridge.deliveries d
WHERE d.status IN ('pending', 'delivering')
GROUP BY 1, 2
ON CONFLICT DO NOTHING;

-- The fast lane's attempt log: append-only, one row per HTTP attempt of a
-- delivery that never became a bridge.deliveries row. Partitioned by day
-- (started_at): retention drops whole partitions, so nothing here is ever
-- updated or deleted row by row and the table leaves no dead tuples to
-- vacuum. Never the payload. Partitions are created ahead by the
-- deliverer's partition-maintenance service.
CREATE TABLE bridge.webhook_attempts (
  subscription_id uuid NOT NULL,
  event_id        text NOT NULL,         -- webhook-id
  event_type      text NOT NULL,
  topic           text NOT NULL,
  kafka_partition int NOT NULL,
  kafka_offset    bigint NOT NULL,
  asset_id        text,
  attempt         int NOT NULL,
  started_at      timestamptz NOT NULL,
  duration_ms     double precision NOT NULL,
  status_code     int,                   -- NULL when no response arrived
  error           text,
  response_body   text,                  -- first 1 KiB
  trace_id        text
) PARTITION BY RANGE (started_at);
CREATE INDEX webhook_attempts_by_event ON bridge.webhook_attempts (subscription_id, event_id);

-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP TABLE bridge.webhook_attempts;
DROP TRIGGER deliveries_parks_settle ON bridge.deliveries;
DROP FUNCTION bridge.delivery_parks_on_settle();
DROP TRIGGER deliveries_parks_insert ON bridge.deliveries;
DROP FUNCTION bridge.delivery_parks_on_insert();
DROP TABLE bridge.delivery_parks;
-- +goose StatementEnd
