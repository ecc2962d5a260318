package outboxstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The log (migration 00230): bridge.outbox_log, four tables in rotation that
// are only ever appended to, and each relay lane's position — the snapshot
// of the last batch it passed (bridge.relay_positions). Every statement
// over the log is here.

// Claimed is one event a relay cycle produces: read from the log (Held
// false) or from bridge.outbox_held (Held true).
type Claimed struct {
	ID        uuid.UUID `db:"id"`
	Seq       int64     `db:"seq"`
	AssetSeq  int64     `db:"asset_seq"`
	Topic     string    `db:"topic"`
	AssetID   *string   `db:"asset_id"`
	Lane      int       `db:"lane"`
	EventType string    `db:"event_type"`
	Payload   string    `db:"payload"` // "" when over the size limit
	// PayloadBytes is the payload's size as JSON text, read in the claim.
	PayloadBytes int               `db:"payload_bytes"`
	Headers      map[string]string `db:"headers"`
	Traceparent  string            `db:"traceparent"`
	Tracestate   string            `db:"tracestate"`
	Attempts     int               `db:"attempts"`
	CreatedAt    time.Time         `db:"created_at"`
	Replayed     bool              `db:"replayed"`
	// Xid is the writer's transaction (a log row's batch key with Seq).
	Xid int64 `db:"xid"`
	// Held: the row comes from bridge.outbox_held.
	Held bool `db:"held"`
	// AssetHeld: the asset has rows in bridge.outbox_held waiting (log rows
	// only): this row must be held behind them, not produced.
	AssetHeld bool `db:"asset_held"`
	// PredecessorPending: the asset's previous event is in the batch's
	// range but later in its (xid, seq) order — its transaction took its xid
	// first and committed after this one's — so this row waits for it (log
	// rows only; see batchSQL).
	PredecessorPending bool `db:"predecessor_pending"`
	// Cost is what the row costs the byte budget; More (the same on every
	// row) says whether the page was cut by the limit or the byte budget.
	More bool `db:"more"`
}

// AssetKey is the row's asset stream ("" for the null asset).
func (w *Claimed) AssetKey() string {
	if w.AssetID == nil {
		return ""
	}
	return *w.AssetID
}

// CurrentSnapshotSQL is the snapshot that ends the next batch.
const currentSnapshotSQL = `SELECT pg_current_snapshot()::text`

// CurrentSnapshot returns pg_current_snapshot() as text. Everything visible
// in it is visible to every statement that starts after it.
func CurrentSnapshot(ctx context.Context, db DB) (string, error) {
	var s string
	if err := db.QueryRow(ctx, currentSnapshotSQL).Scan(&s); err != nil {
		return "", fmt.Errorf("read the current snapshot: %w", err)
	}
	return s, nil
}

// batchSQL reads the next page of the batch ($2, $3]: the events of lanes
// $1 whose transactions are visible in snapshot $3 and not in $2, after the
// key ($4, $5) in (xid, seq) order, at most $6 of them. $3 NULL ends the
// batch at the statement's own snapshot (in ReadCycle's transaction, the
// snapshot it returns).
//
// The batch is found by xid, never by a scan of what was passed: events of
// transactions at or above $2's xmax (one range of outbox_log_xid), and
// events of the transactions $2 saw in progress (point lookups), each
// filtered to what $3 sees committed. The range's lower bound is one row
// comparison, the later of ($2's xmax, 0) and the key ($4, $5): a btree
// scan starts at the first row-comparison key it is given and does not
// weigh it against a scalar bound on the same column, so a separate
// "xid >= xmax" beside "(xid, seq) > (0, 0)" would start every batch at the
// table's first row and walk its whole index (5 ms a page at 200,000 rows,
// growing with the table until it rotates). A transaction that stays open
// long lands in the batch after its commit, whatever seq its events drew: no
// event is skipped and none is read twice, and a held snapshot (a report in
// another session) costs nothing, as nothing here leaves dead tuples.
//
// Per asset the batch is in commit order: one asset's writers are
// serialised by its counter row's lock, so its later event commits after,
// and draws its seq after, the earlier one; within a page rows are returned
// by (xid, seq) and the relay orders each asset by asset_seq. Across pages,
// (xid, seq) order is not commit order: a transaction that took its xid
// before the asset's previous writer took the lock sorts before it.
// ReadCycle flags such a row (predecessor_pending, see predecessorsSQL) and
// the relay keeps it until its predecessor is read.
//
// The lanes must still be held: ReadCycle checks the fence once, in the
// same snapshot (see cycleStartSQL), so a relay whose lease renewals
// stalled stops reading before another can take over.
// A payload over $7 bytes comes back empty with its size (the relay parks
// it without holding it); the page stops once the payloads reach $8 bytes
// (the first row always comes). Every sort is by (xid, seq): what is
// decided per asset (held assets, predecessors) is decided by ReadCycle
// from the page, as sorting a page of 1,000 rows by asset key (text, under
// the database's collation) twice cost more than reading it.
const batchSQL = `
WITH cand AS (
  SELECT u.* FROM (
    (SELECT l.* FROM bridge.outbox_log l
     WHERE l.xid = ANY(ARRAY(SELECT pg_snapshot_xip($2::pg_snapshot)))
       AND (l.xid, l.seq) > ($4::text::xid8, $5::bigint)
       AND pg_visible_in_snapshot(l.xid, coalesce($3::pg_snapshot, pg_current_snapshot()))
       AND l.lane = ANY($1::int[])
     ORDER BY l.xid, l.seq
     LIMIT $6)
    UNION ALL
    (SELECT l.* FROM bridge.outbox_log l
     WHERE (l.xid, l.seq) > (greatest(pg_snapshot_xmax($2::pg_snapshot), $4::text::xid8),
                             CASE WHEN $4::text::xid8 >= pg_snapshot_xmax($2::pg_snapshot) THEN $5::bigint ELSE 0 END)
       AND l.xid < pg_snapshot_xmax(coalesce($3::pg_snapshot, pg_current_snapshot()))
       AND pg_visible_in_snapshot(l.xid, coalesce($3::pg_snapshot, pg_current_snapshot()))
       AND l.lane = ANY($1::int[])
     ORDER BY l.xid, l.seq
     LIMIT $6)
  ) u
  ORDER BY u.xid, u.seq
  LIMIT $6
),
budget AS (
  SELECT c.*, CASE WHEN c.payload_bytes <= $7 THEN c.payload_bytes ELSE 0 END AS cost,
         count(*) OVER () AS claimable
  FROM cand c
),
running AS (
  SELECT b.*, sum(b.cost) OVER (ORDER BY b.xid, b.seq) AS spent FROM budget b
),
page AS (
  SELECT r.*, count(*) OVER () AS kept FROM running r WHERE r.spent - r.cost < $8
)
SELECT p.id, p.seq, p.asset_seq, p.topic, p.asset_id, p.lane, p.event_type,
       CASE WHEN p.payload_bytes <= $7 THEN p.payload::text ELSE '' END AS payload, p.payload_bytes,
       p.headers, coalesce(p.traceparent, '') AS traceparent, coalesce(p.tracestate, '') AS tracestate,
       0 AS attempts, p.created_at, false AS replayed, p.xid::text::bigint AS xid, false AS held,
       false AS asset_held, false AS predecessor_pending,
       (p.claimable >= $6 OR p.kept < p.claimable) AS more
FROM page p
ORDER BY p.xid, p.seq`

// BatchParams select a page of a lane group's batch.
// (ReadCycle takes Member, Margin and MaxPayloadBytes from its CycleParams.)
type BatchParams struct {
	Member string        // the replica reading (bridge.relay_lanes.owner)
	Lanes  []int         // lanes it reads for; all must still be held
	Margin time.Duration // lease that must be left on every lane
	// Prev is the lanes' position (the batch starts after it), Cur the
	// snapshot that ends the batch.
	Prev, Cur string
	// AfterXid, AfterSeq: the key of the last row already read of this
	// batch (0, 0: none).
	AfterXid, AfterSeq int64
	Limit              int
	MaxPayloadBytes    int // a larger payload is not returned (only its size)
	BatchBytes         int // bounds the payload bytes one page returns
	// Known maps an asset key to the last asset_seq of it the relay
	// produced: its successor needs no predecessor lookup (see markPages).
	Known map[string]int64
}

// heldDueSQL returns the held rows of lanes $1 that may go out now: for each
// held asset whose first row (lowest asset_seq) is due, its rows in
// asset_seq order while they follow each other without a gap (a gap is an
// event not read from the log yet). At most $2 rows; a payload over $3
// bytes comes back empty. Fenced like the batch (cycleStartSQL).
const heldDueSQL = `
WITH heads AS (
  SELECT DISTINCT ON (coalesce(h.asset_id, '')) coalesce(h.asset_id, '') AS asset_key, h.asset_seq, h.next_attempt_at
  FROM bridge.outbox_held h
  WHERE h.status = 'NEW' AND h.lane = ANY($1::int[])
  ORDER BY coalesce(h.asset_id, ''), h.asset_seq
),
due AS (
  SELECT h.*, row_number() OVER (PARTITION BY coalesce(h.asset_id, '') ORDER BY h.asset_seq) AS n, d.asset_seq AS head_seq
  FROM heads d
  JOIN bridge.outbox_held h ON coalesce(h.asset_id, '') = d.asset_key AND h.status = 'NEW' AND h.lane = ANY($1::int[])
  WHERE d.next_attempt_at <= now()
)
SELECT id, seq, asset_seq, topic, asset_id, lane, event_type,
       CASE WHEN payload_bytes <= $3 THEN payload::text ELSE '' END AS payload, payload_bytes,
       headers, coalesce(traceparent, '') AS traceparent, coalesce(tracestate, '') AS tracestate,
       attempts, created_at, replayed_at IS NOT NULL AS replayed, 0::bigint AS xid, true AS held,
       false AS asset_held, false AS predecessor_pending, false AS more
FROM due
WHERE asset_seq = head_seq + n - 1
ORDER BY seq
LIMIT $2`

// heldAssetsSQL lists the assets of lanes $1 with rows waiting in
// bridge.outbox_held: a log row of one of them is held behind them, not
// produced (Claimed.AssetHeld).
const heldAssetsSQL = `
SELECT DISTINCT coalesce(h.asset_id, '') FROM bridge.outbox_held h
WHERE h.status = 'NEW' AND h.lane = ANY($1::int[])`

// predecessorsSQL says which of the rows ($1 asset key, $2 asset_seq, $3
// xid, $4 seq; numbered from 1 in that order) have their asset's previous
// event in the batch after snapshot $5 but later in (xid, seq) order. Asked
// only for a row whose predecessor is neither earlier in its page nor the
// last event of its asset the relay produced (BatchParams.Known): after a
// start or a lane takeover, not in the steady state.
const predecessorsSQL = `
SELECT k.i::int FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[]) WITH ORDINALITY AS k(asset_key, asset_seq, xid, seq, i)
WHERE EXISTS (SELECT 1 FROM bridge.outbox_log q
              WHERE coalesce(q.asset_id, '') = k.asset_key AND q.asset_seq = k.asset_seq - 1
                AND NOT pg_visible_in_snapshot(q.xid, $5::pg_snapshot)
                AND (q.xid, q.seq) > (k.xid::xid8, k.seq))`

// cycleStartSQL opens a relay cycle's read (see ReadCycle): the snapshot
// that ends the batches it opens, and the generic plan for the statements
// after it. Planning the batch read over the log's four tables took 4–7 ms
// against 1–2 ms of execution, on every page, and PostgreSQL kept choosing
// a custom plan; the generic plan walks the same indexes (the (xid, seq)
// index from the batch's key, the asset index for predecessors), whatever
// the parameters.
//
// It also says whether the fence lets the read through: every lane of $1
// held by $2 with $3 of its lease left. It is the read's only fence: every
// statement of the read sees the same repeatable-read snapshot and the same
// now(), so the fence would answer the same in each, and ReadCycle drops
// the rows of a read it refuses (CycleRead.Fenced, with empty pages and no
// held rows). bridge.relay_fence is an SQL function PostgreSQL parses and
// plans again on every call: asked in this statement, the held rows' and
// each batch's, it was 40% of the relay's PostgreSQL CPU at 1,000 events/s.
const cycleStartSQL = `SELECT pg_current_snapshot()::text, pg_postmaster_start_time()::text, set_config('plan_cache_mode', 'force_generic_plan', true),
  $1::int[] <@ bridge.relay_fence($2, $3::interval)`

// CycleParams select what one relay cycle reads.
type CycleParams struct {
	Member string        // the replica reading (bridge.relay_lanes.owner)
	Lanes  []int         // every lane it holds: their held rows that are due
	Margin time.Duration // lease that must be left on every lane
	// HeldLimit bounds the held rows read (0: none are read).
	HeldLimit       int
	MaxPayloadBytes int // a larger payload is not returned (only its size)
	// Batches: a page of each group's batch. A Cur of "" opens the batch:
	// it ends at the cycle's snapshot (CycleRead.Snapshot).
	Batches []BatchParams
}

// CycleRead is what one relay cycle read.
type CycleRead struct {
	// Snapshot ends every batch the read opened.
	Snapshot string
	// Server is the start time of the server that answered: it changes
	// when PostgreSQL restarted or a standby was promoted, and a snapshot
	// taken before that must not be compared with transaction ids after
	// it (see relay's forgetPositions).
	Server string
	// Fenced: the fence refused the read (a lane not held by the member,
	// or with less than the margin of its lease left), so the pages are
	// empty whatever the batches hold. A relay must not take such a read as
	// the end of its batches: its position would pass rows it never read.
	Fenced bool
	// Held are the held rows that may go out now (see heldDueSQL).
	Held []*Claimed
	// Pages[i] is the page of Batches[i], More[i] whether more of that
	// batch is left.
	Pages [][]*Claimed
	More  []bool
}

// ReadCycle reads everything a relay cycle produces in one round trip: a
// snapshot, the held rows that are due and a page of each group's batch, in
// one REPEATABLE READ transaction, so the snapshot it returns is the one
// every statement of it saw and ends the batches it opened. Three round
// trips (the snapshot, the held rows, the page) were most of a cycle's
// database time at low rates, when a page holds a few rows.
func ReadCycle(ctx context.Context, db DB, p CycleParams) (CycleRead, error) {
	out := CycleRead{Pages: make([][]*Claimed, len(p.Batches)), More: make([]bool, len(p.Batches))}
	b := &pgx.Batch{}
	b.Queue(`BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY`)
	b.Queue(cycleStartSQL, p.Lanes, p.Member, Interval(p.Margin))
	if p.HeldLimit > 0 {
		b.Queue(heldDueSQL, p.Lanes, p.HeldLimit, p.MaxPayloadBytes)
	}
	for _, g := range p.Batches {
		var cur *string
		if g.Cur != "" {
			cur = &g.Cur
		}
		b.Queue(batchSQL, g.Lanes, g.Prev, cur, strconv.FormatInt(g.AfterXid, 10), g.AfterSeq,
			g.Limit, p.MaxPayloadBytes, g.BatchBytes)
	}
	b.Queue(heldAssetsSQL, p.Lanes)
	b.Queue(`COMMIT`)
	br := db.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return out, fmt.Errorf("read an outbox cycle: begin: %w", err)
	}
	var plan string
	var fenceOK bool
	if err := br.QueryRow().Scan(&out.Snapshot, &out.Server, &plan, &fenceOK); err != nil {
		return out, fmt.Errorf("read an outbox cycle: take the snapshot: %w", err)
	}
	out.Fenced = !fenceOK
	if p.HeldLimit > 0 {
		rows, err := br.Query()
		if err == nil {
			out.Held, err = pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[Claimed])
		}
		if err != nil {
			return out, fmt.Errorf("read held outbox rows: %w", err)
		}
	}
	for i := range p.Batches {
		rows, err := br.Query()
		if err == nil {
			out.Pages[i], err = pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[Claimed])
		}
		if err != nil {
			return out, fmt.Errorf("read an outbox batch: %w", err)
		}
		out.More[i] = len(out.Pages[i]) > 0 && out.Pages[i][0].More
	}
	rows, err := br.Query()
	if err != nil {
		return out, fmt.Errorf("read the held assets: %w", err)
	}
	heldAssets := map[string]bool{}
	var k string
	if _, err := pgx.ForEachRow(rows, []any{&k}, func() error { heldAssets[k] = true; return nil }); err != nil {
		return out, fmt.Errorf("read the held assets: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return out, fmt.Errorf("read an outbox cycle: commit: %w", err)
	}
	if err := br.Close(); err != nil {
		return out, fmt.Errorf("read an outbox cycle: %w", err)
	}
	if out.Fenced {
		// The lanes are not held with the margin: nothing read may be
		// produced, whatever the statements found.
		out.Held = nil
		for i := range out.Pages {
			out.Pages[i], out.More[i] = nil, false
		}
		return out, nil
	}
	if err := markPages(ctx, db, p.Batches, out.Pages, heldAssets); err != nil {
		return out, err
	}
	return out, nil
}

// markPages sets AssetHeld on the rows of held assets and
// PredecessorPending on the rows whose predecessor comes later in their
// batch (predecessorsSQL, asked only for the rows that need it).
func markPages(ctx context.Context, db DB, batches []BatchParams, pages [][]*Claimed, heldAssets map[string]bool) error {
	type ask struct {
		w    *Claimed
		prev string // the batch's start
	}
	var asks []ask
	for i, page := range pages {
		last := map[string]int64{} // the asset's previous row in the page
		for _, w := range page {
			k := w.AssetKey()
			w.AssetHeld = heldAssets[k]
			prev, inPage := last[k]
			last[k] = w.AssetSeq
			if w.AssetSeq <= 1 || (inPage && prev == w.AssetSeq-1) {
				continue
			}
			if n, ok := batches[i].Known[k]; ok && n == w.AssetSeq-1 {
				continue
			}
			asks = append(asks, ask{w: w, prev: batches[i].Prev})
		}
	}
	// One statement per batch start (the groups of a cycle share one but
	// for a lane just taken over).
	for len(asks) > 0 {
		prev := asks[0].prev
		var these []*Claimed
		var keys, xids []string
		var assetSeqs, seqs []int64
		rest := asks[:0]
		for _, a := range asks {
			if a.prev != prev {
				rest = append(rest, a)
				continue
			}
			these = append(these, a.w)
			keys, assetSeqs = append(keys, a.w.AssetKey()), append(assetSeqs, a.w.AssetSeq)
			xids, seqs = append(xids, strconv.FormatInt(a.w.Xid, 10)), append(seqs, a.w.Seq)
		}
		asks = rest
		rows, err := db.Query(ctx, predecessorsSQL, keys, assetSeqs, xids, seqs, prev)
		if err != nil {
			return fmt.Errorf("check outbox rows' predecessors: %w", err)
		}
		var i int
		if _, err := pgx.ForEachRow(rows, []any{&i}, func() error { these[i-1].PredecessorPending = true; return nil }); err != nil {
			return fmt.Errorf("check outbox rows' predecessors: %w", err)
		}
	}
	return nil
}

// ReadBatch returns the next page of one batch (see batchSQL) and whether
// more of it is left.
func ReadBatch(ctx context.Context, db DB, p BatchParams) ([]*Claimed, bool, error) {
	r, err := ReadCycle(ctx, db, CycleParams{Member: p.Member, Lanes: p.Lanes, Margin: p.Margin,
		MaxPayloadBytes: p.MaxPayloadBytes, Batches: []BatchParams{p}})
	if err != nil {
		return nil, false, err
	}
	return r.Pages[0], r.More[0], nil
}

// Position is where a lane is in the log: it passed every event snapshot
// Tick sees, and of a batch read in part (BatchEnd not ""), the events up to
// the key (AfterXid, AfterSeq).
type Position struct {
	Tick, BatchEnd     string
	AfterXid, AfterSeq int64
}

// lanePositionsSQL reads lanes' positions.
const lanePositionsSQL = `
SELECT lane, tick::text, coalesce(batch_end::text, ''), coalesce(after_xid::text::bigint, 0), coalesce(after_seq, 0)
FROM bridge.relay_positions WHERE lane = ANY($1::int[])`

// LanePositions returns each lane's position.
func LanePositions(ctx context.Context, db DB, lanes []int) (map[int]Position, error) {
	rows, err := db.Query(ctx, lanePositionsSQL, lanes)
	if err != nil {
		return nil, fmt.Errorf("read lane positions: %w", err)
	}
	out := map[int]Position{}
	var lane int
	var p Position
	_, err = pgx.ForEachRow(rows, []any{&lane, &p.Tick, &p.BatchEnd, &p.AfterXid, &p.AfterSeq}, func() error {
		out[lane] = p
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read lane positions: %w", err)
	}
	return out, nil
}

// savePositionSQL moves lanes' position: the relay's only write on the
// happy path, one row per lane, fenced like every outcome (the lanes must
// still be held by $1) and by the server the position was read from ($7,
// its start time; ” for a position that came from this table): a position
// read before PostgreSQL restarted or failed over is never written after
// (see the relay's forgetPositions). It commits without waiting for its WAL
// flush: a position lost in a database crash only makes the lanes read
// their last events again, with the same dedup-ids.
const savePositionSQL = `
UPDATE bridge.relay_positions rl
SET tick = $3::pg_snapshot, batch_end = nullif($4, '')::pg_snapshot,
    after_xid = CASE WHEN $4 <> '' THEN $5::text::xid8 END, after_seq = CASE WHEN $4 <> '' THEN $6::bigint END
WHERE rl.lane = ANY($2::int[])
  AND rl.lane = ANY((SELECT bridge.relay_fence($1))::int[])
  AND ($7 = '' OR pg_postmaster_start_time() = $7::timestamptz)
  AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'`

// SavePosition records lanes' position read from server (CycleRead.Server;
// "" when it was read from this table), and returns how many lanes it
// moved (fewer than asked when a lease was lost or the server changed).
func SavePosition(ctx context.Context, db DB, member, server string, lanes []int, p Position) (int64, error) {
	tag, err := db.Exec(ctx, savePositionSQL, member, lanes, p.Tick, p.BatchEnd, strconv.FormatInt(p.AfterXid, 10), p.AfterSeq, server)
	if err != nil {
		return 0, fmt.Errorf("save lane positions: %w", err)
	}
	return tag.RowsAffected(), nil
}

// rotateSQL runs one step of the rotation (bridge.outbox_log_rotate): the
// next table is truncated and becomes current when every lane passed all
// of it and it stopped taking events at least $1 ago.
const rotateSQL = `SELECT bridge.outbox_log_rotate($1::interval, $2)`

// Rotate runs one rotation step and returns the new current table, or -1
// when nothing rotated yet.
func Rotate(ctx context.Context, db DB, retention, lockWait time.Duration) (int, error) {
	var tbl *int
	if err := db.QueryRow(ctx, rotateSQL, Interval(retention), int(lockWait.Milliseconds())).Scan(&tbl); err != nil {
		return -1, fmt.Errorf("rotate the outbox log: %w", err)
	}
	if tbl == nil {
		return -1, nil
	}
	return *tbl, nil
}

// currentTableSinceSQL: when the current table started taking events.
const currentTableSinceSQL = `SELECT tbl, since FROM bridge.outbox_log_tables WHERE current`

// CurrentTable returns the table new events go to and since when.
func CurrentTable(ctx context.Context, db DB) (int, time.Time, error) {
	var tbl int
	var since time.Time
	if err := db.QueryRow(ctx, currentTableSinceSQL).Scan(&tbl, &since); err != nil {
		return 0, since, fmt.Errorf("read the current outbox table: %w", err)
	}
	return tbl, since, nil
}
