package outboxstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/pgtest"
)

func enqueueOne(t *testing.T, ctx context.Context, db pgx.Tx, asset string) int64 {
	t.Helper()
	seq, err := enqueueSeq(ctx, db, asset)
	if err != nil {
		t.Fatalf("enqueue %q: %v", asset, err)
	}
	return seq
}

// enqueueSeq enqueues one event of asset and returns its asset_seq (two
// statements: a row a function inserts is not visible to the statement that
// called it).
func enqueueSeq(ctx context.Context, db pgx.Tx, asset string) (int64, error) {
	var id string
	if err := db.QueryRow(ctx, `SELECT bridge.enqueue('t', nullif($1, ''), 'e', '1'::jsonb)::text`, asset).Scan(&id); err != nil {
		return 0, err
	}
	var seq int64
	err := db.QueryRow(ctx, `SELECT asset_seq FROM bridge.outbox WHERE id = $1::uuid`, id).Scan(&seq)
	return seq, err
}

func commitOne(t *testing.T, ctx context.Context, db *pgtest.DB, asset string) int64 {
	t.Helper()
	var seq int64
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		seq = enqueueOne(t, ctx, tx, asset)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return seq
}

func counterRow(t *testing.T, ctx context.Context, db *pgtest.DB, asset string) (ctid string, last int64) {
	t.Helper()
	if err := db.Pool.QueryRow(ctx, `SELECT ctid::text, last_asset_seq FROM bridge.asset_counters WHERE asset_key = $1`, asset).Scan(&ctid, &last); err != nil {
		t.Fatalf("counter of %q: %v", asset, err)
	}
	return ctid, last
}

// A writer locks its asset's counter row without writing a new version of it
// (migration 00130): while another session holds a transaction open no
// version can be pruned, and a counter rewritten per event makes every later
// write of the asset walk all of them (the writers' rate falls by three
// quarters within minutes). A new version moves the row (its ctid), so the
// ctid must stay put however many events are written, alone or in batches.
func TestEnqueueLocksTheAssetCounterWithoutRewritingIt(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	if got := commitOne(t, ctx, db, "A"); got != 1 {
		t.Fatalf("first asset_seq %d", got)
	}
	ctidA, _ := counterRow(t, ctx, db, "A")
	commitOne(t, ctx, db, "B")
	ctidB, _ := counterRow(t, ctx, db, "B")
	for i := range 5 {
		if got := commitOne(t, ctx, db, "A"); got != int64(i+2) {
			t.Fatalf("event %d of A got asset_seq %d", i+2, got)
		}
	}
	// A batch pre-locks every counter it touches (LockCountersSQL).
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, LockCountersSQL, []string{"A", "B"}); err != nil {
			return err
		}
		if a, b := enqueueOne(t, ctx, tx, "A"), enqueueOne(t, ctx, tx, "B"); a != 7 || b != 2 {
			return fmt.Errorf("batch got A %d, B %d; want 7, 2", a, b)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if c, _ := counterRow(t, ctx, db, "A"); c != ctidA {
		t.Fatalf("A's counter row moved %s → %s: enqueue wrote a new version of it", ctidA, c)
	}
	if c, _ := counterRow(t, ctx, db, "B"); c != ctidB {
		t.Fatalf("B's counter row moved %s → %s: the batch lock wrote a new version of it", ctidB, c)
	}
}

// The counter row is still the per-asset writer lock: a second writer of the
// asset waits for the first to commit and then takes the next number (for
// one asset, seq order = commit order); a rolled-back writer leaves no gap.
func TestSecondWriterOfAnAssetWaitsForTheFirst(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	commitOne(t, ctx, db, "A")
	first, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Rollback(ctx) }()
	if got := enqueueOne(t, ctx, first, "A"); got != 2 {
		t.Fatalf("first writer got %d", got)
	}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()
	second := make(chan error, 1)
	var secondSeq int64
	go func() {
		second <- pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var err error
			secondSeq, err = enqueueSeq(ctx, tx, "A")
			return err
		})
	}()
	for {
		var waiting bool
		if err := db.Pool.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-second:
			t.Fatalf("the second writer finished (%v, asset_seq %d) while the first still held the asset", err, secondSeq)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil || secondSeq != 3 {
		t.Fatalf("second writer: asset_seq %d, %v; want 3", secondSeq, err)
	}
	// A rollback leaves no gap.
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		enqueueOne(t, ctx, tx, "A")
		return fmt.Errorf("roll back")
	}); err == nil {
		t.Fatal("rollback expected")
	}
	if got := commitOne(t, ctx, db, "A"); got != 4 {
		t.Fatalf("after a rollback: asset_seq %d, want 4", got)
	}
}
