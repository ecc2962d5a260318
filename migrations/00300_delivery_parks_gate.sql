-- Why this exists: the park markers of bridge.delivery_parks (migration
-- 00220) serve the fast lane only, but their insert trigger ran on every
-- path: each fan-out insert of `bridge consume` upserted its streams'
-- markers, and each settle then locked the marker, looked for the stream's
-- other open rows and deleted it. On an installation that never turns the
-- fast lane on that was a marker write, a row lock and a delete per
-- delivery, and their dead tuples, for nobody (docs/benchmarks.md,
-- "Pipeline").
--
-- The markers are now written once the fast lane has started:
-- bridge.delivery_parks_gate holds when (parks_since; NULL: never). The
-- fast lane's start (store.EnableParks) sets it, once, and it is never
-- cleared. Until then:
--  * an INSERT of open deliveries writes no marker;
--  * a reopening UPDATE (revive) writes none;
--  * a settle finds no marker to delete (the table is empty), one index
--    probe.
--
-- The switch-on is race-free against those writers: each one that reads the
-- gate off takes the shared transaction-level advisory lock
-- 7411008 and reads the gate again before writing nothing; the
-- switch-on takes the same lock exclusively, sets the gate and parks every
-- stream that has an open row, in one transaction. So it waits for every
-- writer that skipped its marker to commit (or roll back) and its snapshot,
-- taken after the lock, sees their rows; a writer that comes later reads the
-- gate on. Once the fast lane reads the markers, no stream with an open row
-- is without one. A settle that raced the switch-on can leave a marker
-- whose stream has no open row: a detour through the slow lane until the
-- fast lane's sweep deletes it, never a reordering.
--
-- An installation whose fast lane already ran (a marker exists, or the
-- fast lane created a partition of its attempt log) starts with the gate
-- on, so a fast-lane member still running the previous version during a
-- rolling upgrade keeps its markers.
-- +goose Up
-- +goose StatementBegin
CREATE TABLE bridge.delivery_parks_gate (
  only_row    boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  parks_since timestamptz            -- NULL: the fast lane never started; no markers are written
);
INSERT INTO bridge.delivery_parks_gate (parks_since)
SELECT CASE WHEN EXISTS (SELECT 1 FROM bridge.delivery_parks)
              OR EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhparent = 'bridge.webhook_attempts'::regclass)
            THEN now() END;

-- bridge.delivery_parks_open() is true once markers are written. Read off,
-- it takes the shared gate lock (held to COMMIT, so the switch-on waits for
-- this transaction) and reads the gate again on a snapshot taken after the
-- lock. Read on, it needs no lock: the gate is never cleared.
CREATE FUNCTION bridge.delivery_parks_open() RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  IF (SELECT g.parks_since IS NOT NULL FROM bridge.delivery_parks_gate g) THEN
    RETURN true;
  END IF;
  PERFORM pg_advisory_xact_lock_shared(7411008);
  RETURN (SELECT g.parks_since IS NOT NULL FROM bridge.delivery_parks_gate g);
END
$fn$;

CREATE OR REPLACE FUNCTION bridge.delivery_parks_on_insert() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  IF NOT bridge.delivery_parks_open() THEN
    RETURN NULL;
  END IF;
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

CREATE OR REPLACE FUNCTION bridge.delivery_parks_on_settle() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  IF NEW.status IN ('pending', 'delivering') THEN
    IF NOT bridge.delivery_parks_open() THEN
      RETURN NULL;
    END IF;
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
  -- the marker. With the gate off there is no marker: one index probe.
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
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
-- Back to markers on every path: every stream with an open row is parked
-- first, as migration 00220 did on upgrade.
INSERT INTO bridge.delivery_parks (subscription_id, asset_key, topic)
SELECT d.subscription_id, coalesce(d.asset_id, ''), min(d.topic)
FROM bridge.deliveries d
WHERE d.status IN ('pending', 'delivering')
GROUP BY 1, 2
ON CONFLICT DO NOTHING;

CREATE OR REPLACE FUNCTION bridge.delivery_parks_on_insert() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
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

CREATE OR REPLACE FUNCTION bridge.delivery_parks_on_settle() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  IF NEW.status IN ('pending', 'delivering') THEN
    INSERT INTO bridge.delivery_parks AS p (subscription_id, asset_key, topic)
    VALUES (NEW.subscription_id, coalesce(NEW.asset_id, ''), NEW.topic)
    ON CONFLICT (subscription_id, asset_key) DO UPDATE SET topic = p.topic;
    RETURN NULL;
  END IF;
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

DROP FUNCTION bridge.delivery_parks_open();
DROP TABLE bridge.delivery_parks_gate;
-- +goose StatementEnd
