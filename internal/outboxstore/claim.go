package outboxstore

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Claimed is one claimed outbox row, as the relay produces it.
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
	// Claimable is how many rows the claim found before the byte budget cut
	// the batch (the same for every row of one claim).
	Claimable int `db:"claimable"`
	// PredecessorStatus is, on an asset's first row in the batch, the status
	// of the asset's event just before it (nil elsewhere, for an asset's
	// first event, and when that event is in ClaimParams.Acked).
	PredecessorStatus *string `db:"predecessor_status"`
	// FloorSeq is the lowest seq still NEW in the claimed lanes above the
	// scan's start (the same for every row of one claim); see claimSQL.
	FloorSeq int64 `db:"floor_seq"`
}

// AssetKey is the row's asset stream ("" for the null asset).
func (w *Claimed) AssetKey() string {
	if w.AssetID == nil {
		return ""
	}
	return *w.AssetID
}

// claimSQL returns the next NEW rows of the lanes this replica holds, in seq
// order. No row lock is needed: a lane has one owner, and only the owner's
// single relay loop claims from it.
//
// The lease is checked here and not only by the keeper's last tick: a replica
// whose renewals stalled must stop claiming a lane before its lease can lapse
// and another replica produce the same asset alongside it. The check is the
// fence (bridge.relay_fence, migration 00010) with a margin, and it is a
// one-time filter over the whole statement — every lane asked for must still
// be held — so it costs one lookup per claim, not one per row.
//
// The NOT EXISTS is the per-asset hold (docs/failure-modes.md §3): asset X's row 5 failed and
// waits for its retry; without the hold, the next claim would hand out X's
// row 6 and Kafka would see 6 before 5. A row whose earlier sibling waits is
// skipped; rows of every other asset still flow. A FAILED row is not NEW, so
// a parked row holds nothing back. The waiting rows are read once per claim
// (MATERIALIZED), above the floor $9 (every NEW row of the lanes is above
// it, a waiting one too: it was claimed before it was charged): with few
// live NEW rows the planner once ran the probe per claimed row as a walk of
// all of outbox_new_by_seq, and while a transaction pinned the xmin horizon
// that index held 590,000 dead entries — every claim timed out after 30 s.
// Every read of that index here starts at a seq ($4, $9) for that reason.
//
// Sizes are checked here, not after reading (payload_bytes, migration
// 00011): a row whose payload is over $7 bytes comes back with its size and
// an empty payload, so the relay parks it
// without ever holding it (a batch of 25 MB rows read whole before the check
// took the relay's memory to hundreds of MiB, and enough of them would have
// killed it, leaving them NEW to be claimed again after every restart). The
// batch is also bounded by bytes: rows stop once the payloads returned reach
// $8 (the first row is always returned, so a budget below one payload still
// makes progress). The relay's memory is then bounded by RELAY_BATCH_BYTES,
// not by RELAY_BATCH_SIZE times the largest payload.
//
// $4 is where the scan starts (rows with seq above it). Marking rows SENT
// leaves dead entries in the NEW index until vacuum, and a scan from the
// lowest seq walks all of them — and none can be removed while another
// session holds a transaction open, so a scan from seq 0 grows with every row
// marked since that transaction began. The relay therefore never scans from
// 0 in steady state. It passes one of:
//   - the resume cursor while a drain is under way: the last seq it claimed;
//   - otherwise (it caught up, or a poll interval passed) its floor: every
//     row of its lanes that is NEW, or will be once its transaction commits,
//     has a seq above it. floor_seq (the lowest NEW seq of the lanes above
//     $4, whatever its hold, retry time or exclusion) is what the relay
//     keeps as the next floor. Rows that become NEW below the floor later (a
//     transaction that committed late, a replay) lower it through their
//     notification (migration 00090); a lane just taken over, or a lost
//     LISTEN connection, resets it to 0.
//
// Rows at or below the cursor that are still NEW are left for the next
// floor scan. Their assets' later rows must wait for them: the claim
// returns the status of every claimed asset's predecessor (below), and the
// relay holds an asset whose predecessor is still NEW.
const claimSQL = `
WITH waiting AS MATERIALIZED (
  SELECT coalesce(e.asset_id, '') AS asset_key, min(e.seq) AS seq
  FROM bridge.outbox e
  WHERE e.status = 'NEW'
    AND e.attempts > 0 -- only a charged row can be waiting; keeps the probe on a tiny index
    AND e.next_attempt_at > now()
    AND e.seq > $9
  GROUP BY 1
),
c AS (
  SELECT o.id, o.seq, o.asset_seq, o.topic, o.asset_id, o.lane, o.event_type, o.payload, o.payload_bytes,
         o.headers, o.traceparent, o.tracestate, o.attempts, o.created_at, o.replayed_at,
         -- bytes this row costs the batch: an oversized row's payload is
         -- never read, so it costs nothing
         CASE WHEN o.payload_bytes <= $7 THEN o.payload_bytes ELSE 0 END AS cost
  FROM bridge.outbox o
  WHERE o.status = 'NEW'
    AND o.lane = ANY($1::int[])
    AND $1::int[] <@ (SELECT bridge.relay_fence($5, $6::interval))
    AND o.seq > $4
    AND o.next_attempt_at <= now()
    AND o.seq <> ALL($3::bigint[]) -- the batch whose outcomes are being written
    AND NOT EXISTS (
      SELECT 1 FROM waiting w WHERE w.asset_key = coalesce(o.asset_id, '') AND w.seq < o.seq)
  ORDER BY o.seq
  LIMIT $2
),
budget AS (
  SELECT c.*, sum(cost) OVER (ORDER BY seq) AS running, count(*) OVER () AS claimable FROM c
),
batch AS (
  SELECT b.*, a.asset_seq IS NOT NULL AS predecessor_acked
  FROM budget b
  LEFT JOIN unnest($10::text[], $11::bigint[]) AS a(asset_key, asset_seq)
    ON a.asset_key = coalesce(b.asset_id, '') AND a.asset_seq = b.asset_seq - 1
  WHERE b.running - b.cost < $8 -- the row starts within the byte budget (the first always does)
)
SELECT id, seq, asset_seq, topic, asset_id, lane, event_type,
       CASE WHEN payload_bytes <= $7 THEN payload::text ELSE '' END AS payload, payload_bytes,
       headers, coalesce(traceparent, '') AS traceparent, coalesce(tracestate, '') AS tracestate,
       attempts, created_at, replayed_at IS NOT NULL AS replayed, claimable,
       -- ORDER BY … LIMIT 1, not min(): it stops at the first live entry
       -- whatever the planner's estimates (an aggregate over the index
       -- walks the whole backlog above $4)
       (SELECT f.seq FROM bridge.outbox f
        WHERE f.status = 'NEW' AND f.lane = ANY($1::int[]) AND f.seq > $4
        ORDER BY f.seq LIMIT 1) AS floor_seq,
       -- The predecessor check, in the same statement: the status of the
       -- event just before each asset's first row in the batch (asset_seq
       -- is gapless, so "the one before" is a point lookup on the unique
       -- (asset, asset_seq) index, whatever the table's history). A NEW
       -- predecessor that is not being settled means an earlier event of the
       -- asset has not gone out yet, and the asset's rows wait. A
       -- predecessor the caller says the broker acked ($10/$11: the batch
       -- being settled) is not looked up — whatever its status, the asset
       -- may go on — which spares the drain a lookup per asset per batch.
       CASE WHEN asset_seq > 1 AND NOT predecessor_acked
                 AND row_number() OVER (PARTITION BY coalesce(asset_id, '') ORDER BY seq) = 1 THEN
         (SELECT p.status FROM bridge.outbox p
          WHERE coalesce(p.asset_id, '') = coalesce(batch.asset_id, '') AND p.asset_seq = batch.asset_seq - 1)
       END AS predecessor_status
FROM batch
ORDER BY seq`

// ClaimParams select the rows a claim returns.
type ClaimParams struct {
	Member string        // the replica claiming (bridge.relay_lanes.owner)
	Lanes  []int         // lanes it claims from; all must still be held
	Margin time.Duration // lease that must be left on every lane
	Limit  int           // rows at most
	After  int64         // only rows with seq above it: the resume cursor or the floor (0: all)
	Floor  int64         // every NEW row of Lanes has a seq above it (0: unknown)
	// Exclude are seqs of rows still being settled: they are NEW until the
	// settlement is written and must not be claimed twice.
	Exclude []int64
	// Acked maps an asset key to the highest asset_seq of it the broker
	// acked in the batch still being settled: its successor needs no
	// predecessor lookup.
	Acked map[string]int64
	// MaxPayloadBytes: a larger payload is not returned (only its size).
	MaxPayloadBytes int
	// BatchBytes bounds the payload bytes one claim returns.
	BatchBytes int
	// FreshPlan plans the claim for the table as it is now instead of
	// using the prepared statement's plan (see Claim).
	FreshPlan bool
	// GenericPlan runs the prepared statement on its generic plan (see
	// Claim); for a claim expected to return a handful of rows. FreshPlan
	// wins over it.
	GenericPlan bool
	// InflightFloor, when set, receives bridge.relay_inflight_floor() read
	// just before the claim's snapshot (same round trip): every seq a
	// writer still in flight holds or will draw is above it (migration
	// 00160). A floor taken from the claim must be capped at it.
	InflightFloor *int64
}

// genericPlanSQL makes the claim sent after it in the same batch (one
// round trip, one implicit transaction: the extended protocol commits at
// the batch's Sync, and the setting is local to that transaction) run on
// the prepared statement's generic plan. PostgreSQL otherwise keeps
// choosing a custom plan for this statement — the generic one's estimate
// for "seq > $4 … LIMIT $2" is higher — and plans it again on every
// execution: 0.54 ms of planning for 0.27 ms of execution when a claim
// returns a few rows, ~170 times a second at 1,000 events/s on a machine
// whose CPU is the commit→ack latency.
//
// A generic plan made from the statistics of an (almost) empty table once
// did every predecessor lookup as a sequential scan; the relay asks for the
// generic plan only while those statistics describe a large table (the
// relay's freshPlansBelow; FreshPlan wins), as for the cached plan.
// Forbidding sequential scans in the same transaction instead was tried:
// the fence's lookup of 64 lanes then cost 10^10 and was JIT-compiled on
// every claim (40–150 ms).
const genericPlanSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true)`

// Claim returns the next rows to produce (see claimSQL), and whether more
// were waiting: the limit was reached or the byte budget cut the batch.
//
// With FreshPlan the claim is planned for the table as it is on this
// execution (pgx.QueryExecModeExec: still one round trip, no prepared
// statement). A prepared statement's generic plan made while the statistics
// described an empty table (a relay idling, polling an empty outbox) stays
// cached after a burst lands, and on an empty table the predecessor lookups
// are sequential scans: the first claim of 1,000 rows after a 100,000-row
// burst took 15–24 s, against 28 ms planned for the table as it is. Planning
// every claim costs ~1.5 ms of commit→ack at p50 (1,000 events/s), so the
// relay asks for it only while the statistics describe a small or stale
// table — the only statistics a dangerous generic plan is made from.
func Claim(ctx context.Context, db DB, p ClaimParams) ([]*Claimed, bool, error) {
	mode := pgx.QueryExecModeCacheStatement
	if p.FreshPlan {
		mode = pgx.QueryExecModeExec
	}
	exclude := p.Exclude
	if exclude == nil {
		exclude = []int64{}
	}
	ackedKeys := make([]string, 0, len(p.Acked))
	ackedSeqs := make([]int64, 0, len(p.Acked))
	for k, n := range p.Acked {
		ackedKeys, ackedSeqs = append(ackedKeys, k), append(ackedSeqs, n)
	}
	args := []any{p.Lanes, p.Limit, exclude, p.After, p.Member, Interval(p.Margin), p.MaxPayloadBytes, p.BatchBytes, p.Floor,
		ackedKeys, ackedSeqs}
	var rows pgx.Rows
	var err error
	if p.FreshPlan {
		// A batch runs in the connection's default mode, so the read of
		// the in-flight floor takes its own round trip here (rare: only
		// while the statistics describe a small or stale table).
		if p.InflightFloor != nil {
			if err := db.QueryRow(ctx, inflightFloorSQL).Scan(p.InflightFloor); err != nil {
				return nil, false, fmt.Errorf("claim outbox rows: read the in-flight floor: %w", err)
			}
		}
		rows, err = db.Query(ctx, claimSQL, append([]any{mode}, args...)...)
	} else {
		b := &pgx.Batch{}
		if p.InflightFloor != nil {
			b.Queue(inflightFloorSQL)
		}
		if p.GenericPlan {
			b.Queue(genericPlanSQL)
		}
		b.Queue(claimSQL, args...)
		br := db.SendBatch(ctx, b)
		defer br.Close()
		if p.InflightFloor != nil {
			if err := br.QueryRow().Scan(p.InflightFloor); err != nil {
				return nil, false, fmt.Errorf("claim outbox rows: read the in-flight floor: %w", err)
			}
		}
		if p.GenericPlan {
			if _, err := br.Exec(); err != nil {
				return nil, false, fmt.Errorf("claim outbox rows: plan it generically: %w", err)
			}
		}
		rows, err = br.Query()
	}
	if err != nil {
		return nil, false, fmt.Errorf("claim outbox rows: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[Claimed])
	if err != nil {
		return nil, false, fmt.Errorf("claim outbox rows: %w", err)
	}
	more := len(claimed) > 0 && (claimed[0].Claimable >= p.Limit || len(claimed) < claimed[0].Claimable)
	return claimed, more, nil
}
