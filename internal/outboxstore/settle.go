package outboxstore

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/database/statement"
)

// Every statement that records an outcome is fenced: `o.lane = ANY(fence)`
// with the lanes bridge.relay_fence (migration 00010) says this replica still
// holds. A replica that stalled past its lease (GC, network) may still see
// acks for records it produced, but it must not mark rows of a lane another
// replica now owns. The duplicate it produced is harmless (same dedup-id); a
// mark is not. The fence is a scalar subquery so it runs once per statement.

// markSentSQL records the broker's acknowledgement. Rows are found by seq
// on the NEW index (outbox_new_by_seq), whose entries for one batch sit on a
// few adjacent pages, rather than by id on the primary key, where a batch's
// random uuids touch a page each. $5..$6 is the batch's seq range: with few
// live NEW rows the planner hashes the batch against a walk of the whole
// index, which is cheap until a transaction pins the xmin horizon and the
// index fills with dead entries nothing can remove (590,000 in two minutes
// at 5,000 events/s); the range keeps any plan within the batch.
//
// The mark commits without waiting for its WAL flush (synchronous_commit off
// for this statement's transaction only, a one-time filter evaluated before
// any row is read): the relay's next step never depends on the mark being
// on disk, and a flush per mark is a WAL fsync the writers' commits queue
// behind. What a PostgreSQL crash can lose is bounded and harmless
// (docs/failure-modes.md §2): marks committed in the last ~3 × wal_writer_delay
// (~0.6 s), and since WAL is written in order, a lost mark takes every later
// one with it, never an earlier one — the rows come back NEW as a suffix of
// what was produced, in seq order, and are produced again with the same
// dedup-id, as after a relay crash between ack and mark. Charges and parks
// keep synchronous commits (an attempt budget must not be refunded by a
// crash).
const markSentSQL = `
UPDATE bridge.outbox o
SET status = 'SENT', sent_at = now(), kafka_partition = m.part, kafka_offset = m.off, last_error = NULL
FROM unnest($2::bigint[], $3::int[], $4::bigint[]) AS m(seq, part, off)
WHERE o.seq = m.seq AND o.status = 'NEW'
  AND o.seq BETWEEN $5 AND $6
  AND o.lane = ANY((SELECT bridge.relay_fence($1))::int[])
  AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'`

// Ack is one broker acknowledgement to record.
type Ack struct {
	Seq       int64 // the row's seq
	Partition int32
	Offset    int64
}

// MarkSent marks acknowledged rows SENT and returns how many it marked (fewer
// than asked when a lane's lease was lost meanwhile).
func MarkSent(ctx context.Context, db DB, member string, acks []Ack) (int64, error) {
	seqs := make([]int64, len(acks))
	parts := make([]int32, len(acks))
	offs := make([]int64, len(acks))
	if len(acks) == 0 {
		return 0, nil
	}
	lo, hi := acks[0].Seq, acks[0].Seq
	for i, a := range acks {
		seqs[i], parts[i], offs[i] = a.Seq, a.Partition, a.Offset
		lo, hi = min(lo, a.Seq), max(hi, a.Seq)
	}
	// Planned afresh each time, like the claim (see Claim): a generic plan
	// cached on an empty table hashes the batch against a scan of all of it.
	// (Its prepared plan once the statistics describe a sizeable table, as
	// the claim does, was tried: the relay fell behind at 5,000 events/s for
	// the 10 s after its first ANALYZE, and late commits waited 1.5 s.)
	tag, err := db.Exec(ctx, markSentSQL, pgx.QueryExecModeExec, member, seqs, parts, offs, lo, hi)
	if err != nil {
		return 0, fmt.Errorf("mark outbox rows sent: %w", err)
	}
	return tag.RowsAffected(), nil
}

// chargeSQL counts a failed send that belongs to the row: attempts+1, the
// error, the next try after the backoff — or FAILED when the budget is spent,
// so the row stops holding back its asset.
const chargeSQL = `
UPDATE bridge.outbox o
SET attempts = o.attempts + 1,
    last_error = m.err,
    next_attempt_at = now() + m.delay_ms * interval '1 millisecond',
    status = CASE WHEN o.attempts + 1 >= $5 THEN 'FAILED' ELSE 'NEW' END,
    failed_at = CASE WHEN o.attempts + 1 >= $5 THEN now() END
FROM unnest($2::uuid[], $3::text[], $4::bigint[]) AS m(id, err, delay_ms)
WHERE o.id = m.id AND o.status = 'NEW'
  AND o.lane = ANY((SELECT bridge.relay_fence($1))::int[])
RETURNING o.id, o.status, o.attempts`

// Charge is one failed send charged to its row.
type Charge struct {
	ID      uuid.UUID
	Err     string
	DelayMs int64 // backoff before the next attempt
}

// Charged is a charged row's new state.
type Charged struct {
	ID       uuid.UUID `db:"id"`
	Status   string    `db:"status"` // NEW (will retry) or FAILED (budget spent)
	Attempts int       `db:"attempts"`
}

// ChargeAttempts charges each row one attempt; a row reaching maxAttempts is
// parked as FAILED, and announced as ann says in the same transaction
// (announceFailedSQL).
func ChargeAttempts(ctx context.Context, db DB, member string, charges []Charge, maxAttempts int, ann Announce) ([]Charged, error) {
	ids := make([]uuid.UUID, len(charges))
	errs := make([]string, len(charges))
	delays := make([]int64, len(charges))
	for i, c := range charges {
		ids[i], errs[i], delays[i] = c.ID, c.Err, c.DelayMs
	}
	if ann.Topic == "" {
		return statement.Select[Charged](ctx, db, "charge outbox attempts", chargeSQL, member, ids, errs, delays, maxAttempts)
	}
	var out []Charged
	b := &pgx.Batch{}
	b.Queue(chargeSQL, member, ids, errs, delays, maxAttempts).Query(func(rows pgx.Rows) error {
		var err error
		out, err = pgx.CollectRows(rows, pgx.RowToStructByName[Charged])
		return err
	})
	queueAnnounceFailed(b, ann, ids)
	// One pgx batch is one implicit transaction: the park and its
	// announcement commit together.
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("charge outbox attempts: %w", err)
	}
	return out, nil
}

// Announce says how a parked row is announced as an operational event
// (contract.OpOutboxFailed and its payload, docs/contract.md); the relay
// fills it in from internal/contract, which this package does not import
// (the public outbox package imports this one and must not link the Kafka
// client). A zero Topic announces nothing.
type Announce struct {
	Topic       string   // BRIDGE_OPERATIONS_TOPIC
	EventType   string   // the event type of the announcement
	AssetPrefix string   // its asset id is this + the parked row's topic
	Skip        []string // event types whose parked rows are not announced (the operational ones)
}

// announceFailedSQL enqueues an outbox.failed operational event ($5 on
// topic $1) for each of the rows $2 that this transaction parked (failed_at
// is the transaction's now()), through bridge.enqueue, in the parking
// statement's transaction: a park that commits is announced, one that rolls
// back is not. A row of the operations topic itself, or an operational event
// wherever it is, is not announced: when the operations topic cannot be
// produced to, each announcement would fail and be announced in turn,
// without end. The events are enqueued in asset order so two relays parking
// rows of the same topics take the per-asset locks in the same order.
const announceFailedSQL = `
SELECT count(bridge.enqueue($1, $3 || o.topic, $5, jsonb_build_object(
         'id', o.id, 'topic', o.topic, 'asset_id', o.asset_id, 'asset_seq', o.asset_seq,
         'event_type', o.event_type, 'attempts', o.attempts, 'error', coalesce(o.last_error, ''),
         'failed_at', o.failed_at)))
FROM (SELECT o.* FROM bridge.outbox o
      WHERE o.id = ANY($2::uuid[]) AND o.status = 'FAILED' AND o.failed_at = now()
        AND o.topic <> $1 AND NOT (o.event_type = ANY($4::text[]))
      ORDER BY o.topic, o.seq
      OFFSET 0) o`

func queueAnnounceFailed(b *pgx.Batch, ann Announce, ids []uuid.UUID) {
	b.Queue(announceFailedSQL, ann.Topic, ids, ann.AssetPrefix, ann.Skip, ann.EventType)
}

// parkSQL parks rows that retrying cannot fix (too large, invalid topic,
// authorization refused) at once, with the reason.
const parkSQL = `
UPDATE bridge.outbox o
SET status = 'FAILED', attempts = o.attempts + 1, last_error = m.err, failed_at = now()
FROM unnest($2::uuid[], $3::text[]) AS m(id, err)
WHERE o.id = m.id AND o.status = 'NEW'
  AND o.lane = ANY((SELECT bridge.relay_fence($1))::int[])`

// Park is one row to park, with the reason operators will read.
type Park struct {
	ID     uuid.UUID
	Reason string
}

// ParkRows parks rows as FAILED and announces them as ann says in the same
// transaction.
func ParkRows(ctx context.Context, db DB, member string, parks []Park, ann Announce) error {
	ids := make([]uuid.UUID, len(parks))
	reasons := make([]string, len(parks))
	for i, p := range parks {
		ids[i], reasons[i] = p.ID, p.Reason
	}
	if ann.Topic == "" {
		if _, err := db.Exec(ctx, parkSQL, member, ids, reasons); err != nil {
			return fmt.Errorf("park outbox rows: %w", err)
		}
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(parkSQL, member, ids, reasons)
	queueAnnounceFailed(b, ann, ids)
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("park outbox rows: %w", err)
	}
	return nil
}
