package outboxstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/pgtest"
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
