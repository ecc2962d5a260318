package outboxstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxbridge/bridge/internal/pgtest"
)

// passAll moves every lane's position to now: everything committed is passed.
func passAll(t *testing.T, ctx context.Context, db *pgtest.DB) {
	t.Helper()
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.relay_positions SET tick = pg_current_snapshot()`); err != nil {
		t.Fatal(err)
	}
}

// rotate runs one rotation step with no retention.
func rotate(t *testing.T, ctx context.Context, db *pgtest.DB) int {
	t.Helper()
	tbl, err := Rotate(ctx, db.Pool, 0, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

func logRows(t *testing.T, ctx context.Context, db *pgtest.DB, tbl int) (n int64) {
	t.Helper()
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.outbox_log WHERE tbl = $1`, tbl).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A table of the log is emptied only once every lane has passed every row in
// it and no transaction can still be inserting into it; the assets whose
// newest rows it held keep their numbers.
func TestRotationTruncatesOnlyTablesEveryLanePassed(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	for range 3 {
		commitOne(t, ctx, db, "A")
	}
	commitOne(t, ctx, db, "")
	// Table 0 holds them; 1, 2 and 3 are empty and become current in turn.
	for want := 1; want <= 3; want++ {
		if got := rotate(t, ctx, db); got != want {
			t.Fatalf("rotation %d: current table %d, want %d", want, got, want)
		}
	}
	// Table 0 is next; no lane has passed its rows.
	if got := rotate(t, ctx, db); got != -1 || logRows(t, ctx, db, 0) != 4 {
		t.Fatalf("rotated onto a table with rows no lane passed: %d, %d rows left", got, logRows(t, ctx, db, 0))
	}
	// A writer that still inserts into table 0 (it read the current table
	// before the rotations) holds it: the rotation does not wait for it.
	late, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	if _, err := late.Exec(ctx, `
INSERT INTO bridge.outbox_log (tbl, id, asset_seq, topic, asset_id, lane, event_type, payload)
VALUES (0, bridge.outbox_log_id(0), 1, 't', 'late', bridge.lane_of('late'), 'e', '{}')`); err != nil {
		t.Fatal(err)
	}
	passAll(t, ctx, db)
	if got := rotate(t, ctx, db); got != -1 {
		t.Fatalf("rotated onto a table a transaction still inserts into (current %d)", got)
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Its row committed after the lanes' positions: not passed yet.
	if got := rotate(t, ctx, db); got != -1 || logRows(t, ctx, db, 0) != 5 {
		t.Fatalf("rotated onto a table with a row committed after the positions: %d", got)
	}
	passAll(t, ctx, db)
	if got := rotate(t, ctx, db); got != 0 || logRows(t, ctx, db, 0) != 0 {
		t.Fatalf("rotation onto the passed table 0: current %d, %d rows left", got, logRows(t, ctx, db, 0))
	}
	if got, null := commitOne(t, ctx, db, "A"), commitOne(t, ctx, db, ""); got != 4 || null != 2 {
		t.Fatalf("after the truncation: A %d (want 4), null asset %d (want 2)", got, null)
	}
	// Retention: a table that stopped taking events less than it ago stays.
	if tbl, err := Rotate(ctx, db.Pool, time.Hour, 100*time.Millisecond); err != nil || tbl != -1 {
		t.Fatalf("rotated within the retention: %d, %v", tbl, err)
	}
}

// The dedup id is unique across the log's tables although each table has its
// own primary key: an id names its table in its two lowest bits and a CHECK
// keeps every row in the table its id names.
func TestDedupIDUniqueAcrossTables(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	seen := map[uuid.UUID]bool{}
	for round := range 4 {
		for i := range 50 {
			var id uuid.UUID
			var tbl int
			if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, `SELECT bridge.enqueue('t', $1, 'e', '{}')`, fmt.Sprint("a-", i)).Scan(&id)
			}); err != nil {
				t.Fatal(err)
			}
			if err := db.Pool.QueryRow(ctx, `SELECT tbl FROM bridge.outbox_log WHERE id = $1`, id).Scan(&tbl); err != nil {
				t.Fatal(err)
			}
			if seen[id] || tbl != round || int(id[15]&3) != tbl {
				t.Fatalf("round %d: id %s (seen before: %v) in table %d", round, id, seen[id], tbl)
			}
			seen[id] = true
		}
		if round < 3 && rotate(t, ctx, db) != round+1 {
			t.Fatalf("rotation %d did not happen", round)
		}
	}
	var id uuid.UUID
	if err := db.Pool.QueryRow(ctx, `SELECT id FROM bridge.outbox_log WHERE tbl = 1 LIMIT 1`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	insert := func(tbl int) error {
		_, err := db.Pool.Exec(ctx, `
INSERT INTO bridge.outbox_log (tbl, id, asset_seq, topic, asset_id, lane, event_type, payload)
VALUES ($1, $2, 1000, 't', 'dup', bridge.lane_of('dup'), 'e', '{}')`, tbl, id)
		return err
	}
	for _, tbl := range []int{0, 2, 3} {
		var pgErr *pgconn.PgError
		if err := insert(tbl); !errors.As(err, &pgErr) || pgErr.Code != "23514" {
			t.Fatalf("id of table 1 inserted into table %d: %v, want a check violation", tbl, err)
		}
	}
	var pgErr *pgconn.PgError
	if err := insert(1); !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("id inserted twice into table 1: %v, want a unique violation", err)
	}
}

// readAll reads a batch (prev, cur] of every lane, page by page.
func readAll(t *testing.T, ctx context.Context, db *pgtest.DB, prev, cur string, limit int) []*Claimed {
	t.Helper()
	var out []*Claimed
	p := BatchParams{Member: "m", Lanes: allLanes(), Margin: 0, Prev: prev, Cur: cur, Limit: limit, MaxPayloadBytes: 1 << 20, BatchBytes: 1 << 30}
	for {
		page, more, err := ReadBatch(ctx, db.Pool, p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, page...)
		if !more {
			return out
		}
		p.AfterXid, p.AfterSeq = page[len(page)-1].Xid, page[len(page)-1].Seq
	}
}

func allLanes() []int {
	out := make([]int, 64)
	for i := range out {
		out[i] = i
	}
	return out
}

func snapshot(t *testing.T, ctx context.Context, db *pgtest.DB) string {
	t.Helper()
	s, err := CurrentSnapshot(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A batch holds exactly the events whose transactions became visible between
// two snapshots: a transaction that took its xid and seq early and commits
// after later ones were read is in the next batch, and nothing is read twice.
// One asset's later writer, which took its xid before the earlier writer
// took the asset's lock, sorts before it in the batch's (xid, seq) order: it
// is flagged as waiting for its predecessor.
func TestBatchesHoldEachEventOnceInCommitOrderPerAsset(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.relay_lanes SET owner = 'm', expires_at = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	start := snapshot(t, ctx, db)
	late, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	lateAsset := enqueueOne(t, ctx, late, "late")
	_ = lateAsset
	commitOne(t, ctx, db, "on-time")
	mid := snapshot(t, ctx, db)
	first := readAll(t, ctx, db, start, mid, 1)
	if len(first) != 1 || first[0].AssetKey() != "on-time" {
		t.Fatalf("first batch: %d rows, want only the committed one", len(first))
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	end := snapshot(t, ctx, db)
	second := readAll(t, ctx, db, mid, end, 1)
	if len(second) != 1 || second[0].AssetKey() != "late" {
		t.Fatalf("second batch: %d rows, want only the late one", len(second))
	}

	// Inversion: B takes its xid (an event of another asset), then A locks
	// X and B waits for it; A commits first, so X's order is A then B.
	b, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Rollback(ctx) }()
	enqueueOne(t, ctx, b, "other")
	a, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Rollback(ctx) }()
	if got := enqueueOne(t, ctx, a, "X"); got != 1 {
		t.Fatalf("A's X: %d", got)
	}
	bDone := make(chan int64, 1)
	go func() {
		n, err := enqueueSeq(ctx, b, "X")
		if err != nil {
			n = -1
		}
		bDone <- n
	}()
	waitForLockWait(t, ctx, db)
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := <-bDone; n != 2 {
		t.Fatalf("B's X: %d, want 2", n)
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	last := snapshot(t, ctx, db)
	rows := readAll(t, ctx, db, end, last, 1)
	var xs []string
	for _, w := range rows {
		xs = append(xs, fmt.Sprintf("%s/%d/pending=%v", w.AssetKey(), w.AssetSeq, w.PredecessorPending))
	}
	want := []string{"other/1/pending=false", "X/2/pending=true", "X/1/pending=false"}
	if fmt.Sprint(xs) != fmt.Sprint(want) {
		t.Fatalf("batch with an inversion: %v, want %v", xs, want)
	}
}

// waitForLockWait waits until some session of the test's database waits on a lock.
func waitForLockWait(t *testing.T, ctx context.Context, db *pgtest.DB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no session waited on the asset's lock")
}

// A page of a batch stops once its payloads reach the byte budget (the first
// row always comes), so the relay's memory is bounded by RELAY_BATCH_BYTES,
// and a payload over the size limit comes back empty, with its size.
func TestBatchPagesStopAtTheByteBudget(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.relay_lanes SET owner = 'm', expires_at = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	start := snapshot(t, ctx, db)
	if _, err := db.Pool.Exec(ctx, `
SELECT bridge.enqueue('t', 'large-' || (g % 10), 'large', to_jsonb(repeat('y', 600000))) FROM generate_series(1, 40) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT bridge.enqueue('t', 'over', 'too.big', to_jsonb(repeat('x', 2000000)))`); err != nil {
		t.Fatal(err)
	}
	end := snapshot(t, ctx, db)
	p := BatchParams{Member: "m", Lanes: allLanes(), Prev: start, Cur: end, Limit: 1000, MaxPayloadBytes: 1_000_000, BatchBytes: 4 << 20}
	total := 0
	for {
		page, more, err := ReadBatch(ctx, db.Pool, p)
		if err != nil {
			t.Fatal(err)
		}
		large := 0
		for _, w := range page {
			switch {
			case w.EventType == "too.big" && (w.Payload != "" || w.PayloadBytes != 2000002):
				t.Fatalf("oversized row came back with %d payload bytes, size %d", len(w.Payload), w.PayloadBytes)
			case w.EventType == "large":
				large++
			}
		}
		if large > 7 {
			t.Fatalf("a page of %d rows of 600 kB under a 4 MiB budget", large)
		}
		total += len(page)
		if !more {
			break
		}
		p.AfterXid, p.AfterSeq = page[len(page)-1].Xid, page[len(page)-1].Seq
	}
	if total != 41 {
		t.Fatalf("read %d rows over the pages, want 41", total)
	}
}

// planNodes walks an EXPLAIN (FORMAT JSON) plan tree.
func planNodes(n map[string]any, visit func(map[string]any)) {
	visit(n)
	kids, _ := n["Plans"].([]any)
	for _, k := range kids {
		if m, ok := k.(map[string]any); ok {
			planNodes(m, visit)
		}
	}
}

// The read of a batch costs what the batch holds, not what the lanes have
// passed: on the generic plan the relay runs, the scan of the log's
// (xid, seq) index starts at the batch, whatever the table holds before it.
// Each page at 1,000 events/s would otherwise walk the whole index of the
// current table (until it rotates): ~5 ms per page at 200,000 rows, the
// bulk of commit→ack at low rates.
func TestBatchReadStartsAtTheBatchNotTheTable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.relay_lanes SET owner = 'm', expires_at = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	// 60,000 rows the lanes have passed: ~180 leaf pages of the index.
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO bridge.outbox_log (tbl, id, asset_seq, topic, asset_id, lane, event_type, payload)
SELECT 0, bridge.outbox_log_id(0), 1, 't', 'passed-' || g, bridge.lane_of('passed-' || g), 'e', '{}'
FROM generate_series(1, 60000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `ANALYZE bridge.outbox_log`); err != nil {
		t.Fatal(err)
	}
	prev := snapshot(t, ctx, db)
	for range 3 {
		commitOne(t, ctx, db, "new")
	}
	cur := snapshot(t, ctx, db)

	lanes := strings.ReplaceAll(strings.Trim(fmt.Sprint(allLanes()), "[]"), " ", ",")
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, q := range []string{
		`SET plan_cache_mode = force_generic_plan`,
		`PREPARE batch(int[], pg_snapshot, pg_snapshot, text, bigint, int, int, int) AS ` + batchSQL,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	var plan []map[string]any
	if err := conn.QueryRow(ctx, fmt.Sprintf(
		`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE batch('{%s}', '%s', '%s', '0', 0, 1000, 1000000, 16777216)`,
		lanes, prev, cur)).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	rows, buffers := 0.0, 0.0
	planNodes(plan[0]["Plan"].(map[string]any), func(n map[string]any) {
		if n["Index Name"] == "outbox_log_0_xid_seq_idx" {
			rows += n["Actual Rows"].(float64)
			buffers += n["Shared Hit Blocks"].(float64) + n["Shared Read Blocks"].(float64)
		}
	})
	if rows != 3 {
		t.Fatalf("the batch's scans of table 0 returned %v rows, want the 3 new events", rows)
	}
	if buffers > 20 {
		t.Fatalf("reading a batch of 3 events touched %v pages of the (xid, seq) index: it walked the 60,000 rows already passed", buffers)
	}
}

// A position is written only to the server it was read from: after a
// restart or a failover (another pg_postmaster_start_time) the save moves
// no lane, so a snapshot from the old server never becomes a lane's
// position on the new one; a position read from the table ("") is saved
// wherever.
func TestPositionIsSavedOnlyToTheServerItWasReadFrom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.relay_lanes SET owner = 'm', expires_at = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	read, err := ReadCycle(ctx, db.Pool, CycleParams{Member: "m", Lanes: []int{0}, Margin: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if read.Server == "" {
		t.Fatal("the cycle's read names no server")
	}
	pos := Position{Tick: read.Snapshot}
	for _, c := range []struct {
		server string
		moved  int64
	}{{"2001-02-03 04:05:06.789+00", 0}, {read.Server, 1}, {"", 1}} {
		n, err := SavePosition(ctx, db.Pool, "m", c.server, []int{0}, pos)
		if err != nil || n != c.moved {
			t.Fatalf("save read from server %q: moved %d lanes (%v), want %d", c.server, n, err, c.moved)
		}
	}
}

// A read the fence refuses (a lane held with less than the margin of its
// lease left, or not held) says so: its pages are empty whatever the lanes
// hold, and a relay that took that for the end of its batches would move
// its position past rows it never read. With the lease left, the same read
// returns the rows and is not fenced.
func TestCycleReadSaysWhenTheFenceRefusedIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.relay_lanes SET owner = 'm', expires_at = now() + interval '2 seconds'`); err != nil {
		t.Fatal(err)
	}
	start := snapshot(t, ctx, db)
	commitOne(t, ctx, db, "a")
	lanes := allLanes()
	read := func(margin time.Duration) CycleRead {
		t.Helper()
		r, err := ReadCycle(ctx, db.Pool, CycleParams{Member: "m", Lanes: lanes, Margin: margin,
			Batches: []BatchParams{{Lanes: lanes, Prev: start, Limit: 100, MaxPayloadBytes: 1 << 20, BatchBytes: 1 << 24}}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := read(time.Minute); !r.Fenced || len(r.Pages[0]) != 0 {
		t.Fatalf("lease shorter than the margin: fenced %v, %d rows; want fenced, none", r.Fenced, len(r.Pages[0]))
	}
	if r := read(0); r.Fenced || len(r.Pages[0]) != 1 {
		t.Fatalf("lease left: fenced %v, %d rows; want not fenced, the one row", r.Fenced, len(r.Pages[0]))
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.relay_lanes SET owner = 'other' WHERE lane = 5`); err != nil {
		t.Fatal(err)
	}
	if r := read(0); !r.Fenced {
		t.Fatal("a lane held by another member: not fenced")
	}
}
