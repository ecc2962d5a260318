-- Why this exists: every transaction that wrote to the outbox sent a NOTIFY
-- (migration 00090), and PostgreSQL serialises the commits of notifying
-- transactions: the first to queue a notification takes the database's
-- notify-queue lock in its pre-commit and holds it through its commit's WAL
-- flush, so notifying transactions commit one flush at a time, whatever
-- group commit could do for them. On this project's 2-core test machine
-- that capped them at ~500 commits a second; 8 writers committing 5,000
-- events/s in transactions of 10 spent most of their time in wait event
-- Lock:object, and any CPU the machine lost put them behind for good.
--
-- The notification had two jobs, and neither needs it from every commit:
--
-- 1. Waking a relay that waits for work. A relay that is busy (it found rows
--    in its last claim and claims again at once) needs no wake-up. Relays now
--    say which they are with session advisory locks, which vanish with their
--    connection: a busy relay holds BUSY shared, a waiting one WAITING shared.
--    A committing transaction notifies unless some relay is busy and none is
--    waiting, so with no relay connected (or after a relay's connection
--    dropped) every commit notifies, as before. The check runs at commit
--    (a deferred trigger, queued once per transaction), not at insert: a
--    transaction that inserts and then works on is judged by the relays'
--    state when it commits.
--
--    The race it must not lose: a writer sees "busy", the relay then finds
--    nothing and goes to wait, and the writer's rows become visible after the
--    relay's last claim, with no notification. So a writer about to skip its
--    notification takes GATE shared (transaction-level: released only after
--    its commit is visible) and then checks again that no relay waits; a
--    relay going to wait takes WAITING, drops BUSY, then takes and drops GATE
--    exclusively — waiting for every such writer to be visible — before its
--    last claim. A writer that finds GATE taken or asked for (a relay is
--    going to wait), or a relay waiting on its second look, notifies.
--
-- 2. Telling relays that rows became NEW below their scan floor (migration
--    00090): a transaction that took its seq before a relay's floor passed it
--    and committed after. Now the floor cannot pass such a transaction: its
--    first insert takes, before any seq is drawn, a transaction-level
--    advisory lock named after the outbox sequence's position then (every
--    seq it draws is above it), and a relay caps its floor at the lowest of
--    those held and at the sequence's position, read before its claim's
--    snapshot (bridge.relay_inflight_floor). Replays still notify with the
--    lowest seq they replayed (bridge.wake_relays), as does every
--    notification an insert still sends.
--
-- Lock keys (the two-int4 form, so no application's bigint keys collide):
-- class x'6F410000' holds BUSY (1), WAITING (2) and GATE (3); class
-- x'6F42' << 16 | the position's high 16 bits, object its low 32 bits, names
-- an in-flight writer (positions up to 2^48; above that they share the top
-- key, which is safe and only makes floors lower than they need to be). The
-- outbox's identity sequence must keep CACHE 1: a session's cached seqs
-- could be below the position the lock names.

-- +goose Up
-- +goose StatementBegin
-- The outbox sequence's position: every seq drawn after this read is above it.
CREATE FUNCTION bridge.outbox_seq_position() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM bridge.outbox_seq_seq
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Before a transaction's first insert into the outbox draws a seq: hold the
-- in-flight lock named after the sequence's position until the transaction
-- ends. (Released with a rolled-back savepoint, as is the setting, so the
-- next insert takes it again.)
CREATE FUNCTION bridge.outbox_hold_inflight() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
  v_pos bigint;
BEGIN
  IF current_setting('bridge.outbox_inflight', true) IS DISTINCT FROM 'on' THEN
    v_pos := least(bridge.outbox_seq_position(), 281474976710655); -- 2^48 - 1
    PERFORM pg_advisory_xact_lock_shared(x'6F420000'::int | (v_pos >> 32)::int, v_pos::bit(32)::int);
    PERFORM set_config('bridge.outbox_inflight', 'on', true);
  END IF;
  RETURN NULL;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Where a relay may put its floor: below every seq an in-flight writer holds
-- or will draw. Read in its own statement before the claim, so that a writer
-- that ended before the claim's snapshot is visible in it.
CREATE FUNCTION bridge.relay_inflight_floor() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  SELECT least(
    (SELECT min(((l.classid::bigint & 65535) << 32) | l.objid::bigint)
     FROM pg_catalog.pg_locks l
     WHERE l.locktype = 'advisory' AND l.objsubid = 2
       AND (l.classid::bigint >> 16) = x'6F42'::int
       AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())),
    bridge.outbox_seq_position())
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- True once per transaction, for its first outbox row (the lowest seq: a
-- session's seqs only grow): the deferred wake-up is queued for that row
-- only. A rolled-back savepoint discards both the queued trigger and the
-- setting.
CREATE FUNCTION bridge.outbox_first_row_of_transaction() RETURNS boolean
LANGUAGE sql VOLATILE AS $$
  SELECT CASE WHEN current_setting('bridge.outbox_wake_queued', true) IS DISTINCT FROM 'on'
              THEN set_config('bridge.outbox_wake_queued', 'on', true) = 'on'
              ELSE false END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- At commit: notify with the transaction's lowest seq unless a relay is busy
-- and none waits (see the top of this file for the locks).
CREATE FUNCTION bridge.outbox_wake_on_commit() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  IF pg_try_advisory_lock(x'6F410000'::int, 2) THEN -- no relay waits
    PERFORM pg_advisory_unlock(x'6F410000'::int, 2);
    IF NOT pg_try_advisory_lock(x'6F410000'::int, 1) THEN -- a relay is busy
      -- Skip the notification, unless a relay starts to wait meanwhile:
      -- hold GATE (a relay going to wait takes WAITING, then passes GATE
      -- only once this commit is visible), then look again. GATE is taken
      -- only here: a notifying commit that held it would keep a relay at
      -- its gate for as long as that commit queues for the notify lock.
      IF pg_try_advisory_xact_lock_shared(x'6F410000'::int, 3)
         AND pg_try_advisory_lock(x'6F410000'::int, 2) THEN
        PERFORM pg_advisory_unlock(x'6F410000'::int, 2);
        RETURN NULL; -- the busy relay claims again after this commit is visible
      END IF;
    ELSE
      PERFORM pg_advisory_unlock(x'6F410000'::int, 1); -- no relay at all
    END IF;
  END IF;
  PERFORM bridge.wake_relays(NEW.seq);
  RETURN NULL;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
DROP TRIGGER outbox_notify ON bridge.outbox;
DROP FUNCTION bridge.notify_outbox();
CREATE TRIGGER outbox_hold_inflight BEFORE INSERT ON bridge.outbox
FOR EACH STATEMENT EXECUTE FUNCTION bridge.outbox_hold_inflight();
CREATE CONSTRAINT TRIGGER outbox_wake AFTER INSERT ON bridge.outbox
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (bridge.outbox_first_row_of_transaction())
EXECUTE FUNCTION bridge.outbox_wake_on_commit();
-- +goose StatementEnd

-- +goose StatementBegin
-- A relay that found rows and claims again at once: writers need not wake it.
CREATE FUNCTION bridge.relay_busy() RETURNS void
LANGUAGE sql VOLATILE AS $$
  SELECT pg_advisory_lock_shared(x'6F410000'::int, 1);
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Waits up to gate_ms for every writer that decided not to notify (it holds
-- GATE shared until its commit is visible) to finish. Returns false if the
-- wait timed out: such a writer's rows may still come without a
-- notification.
CREATE FUNCTION bridge.relay_gate(gate_ms int) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  PERFORM set_config('lock_timeout', gate_ms || 'ms', true);
  PERFORM pg_advisory_lock(x'6F410000'::int, 3);
  PERFORM pg_advisory_unlock(x'6F410000'::int, 3);
  RETURN true;
EXCEPTION WHEN lock_not_available THEN
  RETURN false;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
-- A relay that found nothing goes to wait: it takes WAITING, drops BUSY if
-- it was busy, then passes the gate (bridge.relay_gate) before its last
-- claim.
CREATE FUNCTION bridge.relay_waiting(gate_ms int, was_busy boolean) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
  SELECT pg_advisory_lock_shared(x'6F410000'::int, 2);
  SELECT CASE WHEN was_busy THEN pg_advisory_unlock_shared(x'6F410000'::int, 1) END;
  SELECT bridge.relay_gate(gate_ms);
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- A waiting relay (holding WAITING) that found rows again: busy.
CREATE FUNCTION bridge.relay_busy_again() RETURNS void
LANGUAGE sql VOLATILE AS $$
  SELECT pg_advisory_lock_shared(x'6F410000'::int, 1);
  SELECT pg_advisory_unlock_shared(x'6F410000'::int, 2);
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP TRIGGER outbox_wake ON bridge.outbox;
DROP TRIGGER outbox_hold_inflight ON bridge.outbox;
DROP FUNCTION bridge.relay_busy_again();
DROP FUNCTION bridge.relay_waiting(int, boolean);
DROP FUNCTION bridge.relay_gate(int);
DROP FUNCTION bridge.relay_busy();
DROP FUNCTION bridge.outbox_wake_on_commit();
DROP FUNCTION bridge.outbox_first_row_of_transaction();
DROP FUNCTION bridge.relay_inflight_floor();
DROP FUNCTION bridge.outbox_hold_inflight();
DROP FUNCTION bridge.outbox_seq_position();
CREATE FUNCTION bridge.notify_outbox() RETURNS trigger
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
CREATE TRIGGER outbox_notify AFTER INSERT ON bridge.outbox
REFERENCING NEW TABLE AS inserted
FOR EACH STATEMENT EXECUTE FUNCTION bridge.notify_outbox();
-- +goose StatementEnd
