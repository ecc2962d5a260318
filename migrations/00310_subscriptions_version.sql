-- Why this exists: the fast lane (internal/delivery/fastlane) fans each
-- record out in memory to the subscriptions it last read. Read once a
-- second, a subscription created just before an event was enqueued was
-- missing from that read, and the event never reached it (the row engine
-- reads bridge.subscriptions in a transaction that starts after the event
-- committed, so it has no such gap).
--
-- The fast lane's rule (docs/architecture.md, "The fast lane"): a record
-- whose event began at e (its created-at, PostgreSQL's now() of the
-- enqueuing transaction) is fanned out only with routes read in a snapshot
-- that began at or after e. Reading every subscription for every such
-- record is what this table avoids: bridge.subscriptions_version holds one
-- number, bumped in the transaction of every change to what the fast lane
-- routes by or posts to. The lane reads `SELECT version, now()` (one row,
-- one index-free scan); an unchanged version means the routes it holds are
-- those of that snapshot, and only a changed one costs a full read.
--
-- What bumps it:
--  * INSERT, DELETE and TRUNCATE of bridge.subscriptions (statement-level:
--    a new subscription or a gone one changes who matches);
--  * an UPDATE that changes a column the fast lane's routes read
--    (store.fastRoutesSQL): enabled, event_types, topic, url, rate_limit,
--    history_since, and whether history_done_at is set. Row-level with a
--    WHEN clause, not statement-level: the slow lane's claim updates
--    rate_tokens and the outcomes update consecutive_failures on the
--    delivery path, statement after statement; a statement-level trigger
--    would bump (and row-lock) the version for each of them, and every
--    check would become a full read. The WHEN clause is evaluated without
--    calling the function, so those updates pay one comparison per row.
--
-- bridge.subscription_secrets does not bump it. A new subscription's secret
-- is inserted in the same transaction as the subscription, so the read the
-- bump causes sees it. A rotation's new secret reaches the lane at its next
-- one-second refresh; until then the lane signs with the secrets that were
-- valid a moment before, which receivers still accept during a rotation
-- (the old secret stays valid for the rotation's grace).
--
-- The version row is locked from the bump to COMMIT, so changes of
-- subscriptions commit one after another; they are operator actions (and
-- auto-disables), a few a second at most.
-- +goose Up
-- +goose StatementBegin
CREATE TABLE bridge.subscriptions_version (
  only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  version  bigint NOT NULL
);
INSERT INTO bridge.subscriptions_version (version) VALUES (1);

CREATE FUNCTION bridge.subscriptions_version_bump() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  UPDATE bridge.subscriptions_version SET version = version + 1;
  RETURN NULL;
END
$fn$;

CREATE TRIGGER subscriptions_version_on_insert_delete
  AFTER INSERT OR DELETE OR TRUNCATE ON bridge.subscriptions
  FOR EACH STATEMENT EXECUTE FUNCTION bridge.subscriptions_version_bump();

CREATE TRIGGER subscriptions_version_on_route_update
  AFTER UPDATE ON bridge.subscriptions
  FOR EACH ROW
  WHEN (OLD.enabled IS DISTINCT FROM NEW.enabled
        OR OLD.event_types IS DISTINCT FROM NEW.event_types
        OR OLD.topic IS DISTINCT FROM NEW.topic
        OR OLD.url IS DISTINCT FROM NEW.url
        OR OLD.rate_limit IS DISTINCT FROM NEW.rate_limit
        OR OLD.history_since IS DISTINCT FROM NEW.history_since
        OR (OLD.history_done_at IS NULL) <> (NEW.history_done_at IS NULL))
  EXECUTE FUNCTION bridge.subscriptions_version_bump();
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP TRIGGER subscriptions_version_on_route_update ON bridge.subscriptions;
DROP TRIGGER subscriptions_version_on_insert_delete ON bridge.subscriptions;
DROP FUNCTION bridge.subscriptions_version_bump();
DROP TABLE bridge.subscriptions_version;
-- +goose StatementEnd
