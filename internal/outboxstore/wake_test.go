package outboxstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// TestWakeUpsCarryTheLowestSeqThatBecameNew: the relay's claim starts at the
// lowest seq it knows to be NEW, so every way a row becomes NEW must say from
// where (migration 00090). An insert notifies once per transaction with the
// transaction's lowest seq (also when its first insert was in a savepoint
// that rolled back); every replay statement notifies with the lowest seq it
// replayed, and a replay of nothing notifies nobody.
func TestWakeUpsCarryTheLowestSeqThatBecameNew(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	listener, err := pgx.ConnectConfig(ctx, db.Pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, `LISTEN bridge_outbox`); err != nil {
		t.Fatal(err)
	}
	// next returns the payloads of the notifications waiting (none: nil).
	next := func() []string {
		var got []string
		for {
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			n, err := listener.WaitForNotification(wctx)
			cancel()
			if err != nil {
				return got
			}
			got = append(got, n.Payload)
		}
	}
	enqueue := func(tx pgx.Tx, asset string) int64 {
		var id uuid.UUID
		var seq int64
		if err := tx.QueryRow(ctx, `SELECT bridge.enqueue('t', $1, 'e', '{}')`, asset).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, `SELECT seq FROM bridge.outbox WHERE id = $1`, id).Scan(&seq); err != nil {
			t.Fatal(err)
		}
		return seq
	}
	want := func(what string, got []string, seqs ...int64) {
		t.Helper()
		var w []string
		for _, s := range seqs {
			w = append(w, strconv.FormatInt(s, 10))
		}
		if len(got) != len(w) || (len(w) > 0 && got[0] != w[0]) {
			t.Fatalf("%s: notifications %q, want %q", what, got, w)
		}
	}

	var first int64
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		first = enqueue(tx, "a")
		enqueue(tx, "b")
		enqueue(tx, "c")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want("three inserts in one transaction", next(), first)

	var kept int64
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SAVEPOINT s`); err != nil {
			return err
		}
		enqueue(tx, "a")
		if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT s`); err != nil {
			return err
		}
		kept = enqueue(tx, "b")
		enqueue(tx, "c")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want("first insert rolled back to a savepoint", next(), kept)

	var parked []int64
	rows, err := db.Pool.Query(ctx, `UPDATE bridge.outbox SET status = 'FAILED', failed_at = now() WHERE asset_id = 'b' RETURNING seq`)
	if err != nil {
		t.Fatal(err)
	}
	if parked, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil || len(parked) != 2 {
		t.Fatalf("park: %v %v", parked, err)
	}
	low := min(parked[0], parked[1])
	if n, err := ReplayFailedMatching(ctx, db.Pool, FailedFilter{AssetID: "b"}); err != nil || n != 2 {
		t.Fatalf("replay matching: %d %v", n, err)
	}
	want("replay matching", next(), low)
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.outbox SET status = 'FAILED', failed_at = now() WHERE asset_id = 'b'`); err != nil {
		t.Fatal(err)
	}
	if n, err := ReplayAllFailed(ctx, db.Pool, "t", 0); err != nil || n != 2 {
		t.Fatalf("replay all: %d %v", n, err)
	}
	want("replay all", next(), low)
	var id uuid.UUID
	if err := db.Pool.QueryRow(ctx, `UPDATE bridge.outbox SET status = 'FAILED', failed_at = now() WHERE seq = $1 RETURNING id`, parked[1]).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if ids, _, err := ReplayIDs(ctx, db.Pool, []uuid.UUID{id, uuid.New()}); err != nil || len(ids) != 1 {
		t.Fatalf("replay by id: %v %v", ids, err)
	}
	want("replay by id", next(), parked[1])
	ids, _, err := ReplayIDs(ctx, db.Pool, []uuid.UUID{id})
	if err != nil || len(ids) != 0 {
		t.Fatalf("replay of no ids: %v %v", ids, err)
	}
	if n, err := ReplayAllFailed(ctx, db.Pool, "no-such-topic", 0); err != nil || n != 0 {
		t.Fatalf("replay all of nothing: %d %v", n, err)
	}
	want("replays of nothing", next())
	if _, err := db.Pool.Exec(ctx, `SELECT bridge.wake_relays(NULL)`); err != nil {
		t.Fatal(err)
	}
	want("wake_relays(NULL)", next())
}

// TestCommitsNotifyOnlyRelaysThatWait: a commit's notification is what made
// writers queue behind one another (migration 00160), so a commit skips it
// while a relay says it is busy and none says it waits — and only then. A
// relay going to wait first waits for the commits that skipped it to be
// visible, and the floor it may scan from stays below every seq a writer in
// flight holds.
func TestCommitsNotifyOnlyRelaysThatWait(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	connect := func() *pgx.Conn {
		c, err := pgx.ConnectConfig(ctx, db.Pool.Config().ConnConfig)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	listener := connect()
	if _, err := listener.Exec(ctx, `LISTEN bridge_outbox`); err != nil {
		t.Fatal(err)
	}
	// One reader for the whole test: pgx closes a connection whose wait
	// for a notification is cancelled, and a closed listener hears nothing.
	payloads := make(chan string, 100)
	readCtx, stopReading := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			n, err := listener.WaitForNotification(readCtx)
			if err != nil {
				return
			}
			payloads <- n.Payload
		}
	}()
	// Registered after connect's Close, so it runs before it: the reader
	// must be gone before the connection is closed under it.
	t.Cleanup(func() { stopReading(); <-stopped })
	// notified returns the payloads heard until none came for 300 ms.
	notified := func() []string {
		var got []string
		for {
			select {
			case p := <-payloads:
				got = append(got, p)
			case <-time.After(300 * time.Millisecond):
				return got
			}
		}
	}
	insert := func(q pgx.Tx) int64 {
		var id uuid.UUID
		var seq int64
		// One asset each: a writer in flight holds its asset's counter.
		if err := q.QueryRow(ctx, `SELECT bridge.enqueue('t', gen_random_uuid()::text, 'e', '{}')`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if err := q.QueryRow(ctx, `SELECT seq FROM bridge.outbox WHERE id = $1`, id).Scan(&seq); err != nil {
			t.Fatal(err)
		}
		return seq
	}
	commitOne := func() int64 {
		var seq int64
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { seq = insert(tx); return nil }); err != nil {
			t.Fatal(err)
		}
		return seq
	}
	// closeRelay closes a relay's connection and waits until its backend
	// has let go of its locks: the server ends a closed session after the
	// client has gone, and a commit in between still sees the relay busy.
	closeRelay := func(c *pgx.Conn) {
		t.Helper()
		pid := c.PgConn().PID()
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 10*time.Second, func() string {
			var holds bool
			if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE pid = $1 AND locktype = 'advisory')`, pid).Scan(&holds); err != nil {
				return err.Error()
			}
			return testkit.Unless(!holds, "backend %d still holds advisory locks after its connection closed", pid)
		})
	}
	want := func(what string, got []string, seqs ...int64) {
		t.Helper()
		var w []string
		for _, s := range seqs {
			w = append(w, strconv.FormatInt(s, 10))
		}
		if strings.Join(got, ",") != strings.Join(w, ",") {
			t.Fatalf("%s: notifications %q, want %q", what, got, w)
		}
	}

	var seq int64
	relay := connect()
	if err := RelayBusy(ctx, relay); err != nil {
		t.Fatal(err)
	}
	commitOne()
	want("a commit while the only relay is busy", notified())

	if settled, err := RelayWaiting(ctx, relay, time.Second, true); err != nil || !settled {
		t.Fatalf("RelayWaiting = %v, %v; want true", settled, err)
	}
	seq = commitOne()
	want("a commit while the relay waits", notified(), seq)

	other := connect()
	if err := RelayBusy(ctx, other); err != nil {
		t.Fatal(err)
	}
	seq = commitOne()
	want("a commit while one relay waits and another is busy", notified(), seq)

	if err := RelayBusyAgain(ctx, relay); err != nil {
		t.Fatal(err)
	}
	commitOne()
	want("a commit while both relays are busy", notified())

	closeRelay(other)
	commitOne()
	want("a commit while the one relay left is busy", notified())
	closeRelay(relay)
	seq = commitOne()
	want("a commit after every relay's connection closed", notified(), seq)

	// The gate: a writer that decided not to notify holds it until its
	// commit is visible. This one's decision runs early (its deferred
	// trigger made immediate), so it holds the gate while its transaction
	// stays open, and a relay going to wait must see that.
	relay = connect()
	if err := RelayBusy(ctx, relay); err != nil {
		t.Fatal(err)
	}
	late, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(context.Background())
	if _, err := late.Exec(ctx, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	insert(late)
	commitOne()
	if settled, err := RelayWaiting(ctx, relay, 50*time.Millisecond, true); err != nil || settled {
		t.Fatalf("RelayWaiting beside a writer that skipped its notification = %v, %v; want false (timed out)", settled, err)
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if settled, err := RelayGate(ctx, relay, time.Second); err != nil || !settled {
		t.Fatalf("RelayGate after that writer committed = %v, %v; want true", settled, err)
	}
	want("the late writer (decided while the relay was busy)", notified())
}
