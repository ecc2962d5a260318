-- Why this exists: a claim that scans NEW rows from seq 0 every
-- time it had caught up (and at least once per poll interval), because a row
-- can become NEW below where the claim has already passed. Marking rows SENT
-- leaves dead entries in outbox_new_by_seq, and while another session holds a
-- transaction open (a long report, a forgotten psql) vacuum cannot remove
-- them: every scan from 0 walked all rows marked since that transaction
-- began. Claim latency grows with it (docs/benchmarks.md, held snapshot)
-- for as long as the transaction stays open.
--
-- The relay now scans from a floor: the lowest seq still NEW in its lanes.
-- A row becomes NEW below that floor in exactly two ways, and both now say
-- where from on the bridge_outbox notification the relays already listen to:
--   * an insert whose transaction took its seq before the floor passed it and
--     committed after (NOTIFY is delivered at commit, after the rows are
--     visible): the payload is the transaction's lowest seq;
--   * a replay (FAILED back to NEW, keeping its seq): the replay statements
--     call bridge.wake_relays with the lowest seq they replayed.
-- A relay that cannot trust its notifications (its LISTEN connection was
-- lost, or a payload it cannot read) scans from 0 once.

-- +goose Up
-- +goose StatementBegin
-- bridge.wake_relays tells the relays that rows from from_seq on may have
-- become NEW (delivered when the caller's transaction commits). STRICT: a
-- statement that changed no row (min() over nothing) wakes nobody.
CREATE FUNCTION bridge.wake_relays(from_seq bigint) RETURNS bigint
LANGUAGE sql STRICT VOLATILE AS $$
  SELECT pg_notify('bridge_outbox', from_seq::text);
  SELECT from_seq;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- One notification per transaction, carrying its lowest seq: the first insert
-- of a transaction holds it, because a session's seqs only grow. A
-- transaction-local setting remembers that this transaction has notified
-- (rolled back with a rolled-back savepoint, as is the notification queued
-- inside it, so the next insert notifies again). An insert of no rows sets
-- nothing, so a later insert of the same transaction still notifies.
CREATE OR REPLACE FUNCTION bridge.notify_outbox() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
  v_low bigint;
BEGIN
  IF current_setting('bridge.outbox_woken', true) IS DISTINCT FROM 'on' THEN
    SELECT min(seq) INTO v_low FROM inserted;
    IF v_low IS NOT NULL THEN
      PERFORM set_config('bridge.outbox_woken', 'on', true);
      PERFORM bridge.wake_relays(v_low);
    END IF;
  END IF;
  RETURN NULL;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
DROP TRIGGER outbox_notify ON bridge.outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON bridge.outbox
REFERENCING NEW TABLE AS inserted
FOR EACH STATEMENT EXECUTE FUNCTION bridge.notify_outbox();
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP TRIGGER outbox_notify ON bridge.outbox;
CREATE OR REPLACE FUNCTION bridge.notify_outbox() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pg_notify('bridge_outbox', '');
  RETURN NULL;
END
$fn$;
CREATE TRIGGER outbox_notify AFTER INSERT ON bridge.outbox
FOR EACH STATEMENT EXECUTE FUNCTION bridge.notify_outbox();
DROP FUNCTION bridge.wake_relays(bigint);
-- +goose StatementEnd
