package outboxstore

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Every statement that records an outcome is fenced: `lane = ANY(fence)`
// with the lanes bridge.relay_fence (migration 00010) says this replica still
// holds. A replica that stalled past its lease (GC, network) may still see
// acks for records it produced, but it must not write outcomes for a lane
// another replica now owns. The duplicate it produced is harmless (same
// dedup-id); an outcome is not. The fence is a scalar subquery so it runs
// once per statement.
//
// The happy path writes nothing per event: the lane's position moves past
// the batch (SavePosition). Only rows that did not go out are written, into
// bridge.outbox_held, and a held row that goes out is marked SENT there.

// holdSQL copies log rows into bridge.outbox_held (attempts 0, due now):
// rows held behind an earlier row of their asset, and rows about to be
// charged or parked. A row already held stays as it is.
const holdSQL = `
INSERT INTO bridge.outbox_held (id, seq, asset_seq, topic, asset_id, lane, event_type, payload, headers, traceparent,
                                tracestate, created_at)
SELECT l.id, l.seq, l.asset_seq, l.topic, l.asset_id, l.lane, l.event_type, l.payload, l.headers, l.traceparent,
       l.tracestate, l.created_at
FROM bridge.outbox_log l
WHERE l.id = ANY($2::uuid[])
  AND l.lane = ANY((SELECT bridge.relay_fence($1))::int[])
ORDER BY l.seq
ON CONFLICT (id) DO NOTHING`

// releaseSentSQL marks held rows the broker acknowledged SENT (they keep
// their attempts for operators; DeleteHeldSent removes them after the
// retention).
const releaseSentSQL = `
UPDATE bridge.outbox_held h
SET status = 'SENT', sent_at = now(), last_error = NULL
WHERE h.id = ANY($2::uuid[]) AND h.status = 'NEW'
  AND h.lane = ANY((SELECT bridge.relay_fence($1))::int[])`

// Outcomes is what one produced batch leaves to write, besides the
// position: log rows to hold (Hold, and every log row in Charges and
// Parks), held rows that went out (Sent), failed sends to charge and rows to
// park. All of it is written in one transaction.
type Outcomes struct {
	Hold        []uuid.UUID
	Sent        []uuid.UUID
	Charges     []Charge
	Parks       []Park
	MaxAttempts int
	Announce    Announce
}

// WriteOutcomes writes o in one transaction and returns the charged rows'
// new state.
func WriteOutcomes(ctx context.Context, db DB, member string, o Outcomes) ([]Charged, error) {
	b := &pgx.Batch{}
	if len(o.Hold) > 0 {
		b.Queue(holdSQL, member, o.Hold)
	}
	if len(o.Sent) > 0 {
		b.Queue(releaseSentSQL, member, o.Sent)
	}
	var out []Charged
	var parked []uuid.UUID
	if len(o.Charges) > 0 {
		ids := make([]uuid.UUID, len(o.Charges))
		errs := make([]string, len(o.Charges))
		delays := make([]int64, len(o.Charges))
		for i, c := range o.Charges {
			ids[i], errs[i], delays[i] = c.ID, c.Err, c.DelayMs
		}
		b.Queue(chargeSQL, member, ids, errs, delays, o.MaxAttempts).Query(func(rows pgx.Rows) error {
			var err error
			out, err = pgx.CollectRows(rows, pgx.RowToStructByName[Charged])
			return err
		})
		parked = append(parked, ids...)
	}
	if len(o.Parks) > 0 {
		ids := make([]uuid.UUID, len(o.Parks))
		reasons := make([]string, len(o.Parks))
		for i, p := range o.Parks {
			ids[i], reasons[i] = p.ID, p.Reason
		}
		b.Queue(parkSQL, member, ids, reasons)
		parked = append(parked, ids...)
	}
	if b.Len() == 0 {
		return nil, nil
	}
	if o.Announce.Topic != "" && len(parked) > 0 {
		queueAnnounceFailed(b, o.Announce, parked)
	}
	// One pgx batch is one implicit transaction: the holds, the charges,
	// the parks and their announcements commit together.
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("write relay outcomes: %w", err)
	}
	return out, nil
}

// chargeSQL counts a failed send that belongs to the row: attempts+1, the
// error, the next try after the backoff — or FAILED when the budget is spent,
// so the row stops holding back its asset.
const chargeSQL = `
UPDATE bridge.outbox_held o
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
FROM (SELECT o.* FROM bridge.outbox_held o
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
UPDATE bridge.outbox_held o
SET status = 'FAILED', attempts = o.attempts + 1, last_error = m.err, failed_at = now()
FROM unnest($2::uuid[], $3::text[]) AS m(id, err)
WHERE o.id = m.id AND o.status = 'NEW'
  AND o.lane = ANY((SELECT bridge.relay_fence($1))::int[])`

// Park is one row to park, with the reason operators will read.
type Park struct {
	ID     uuid.UUID
	Reason string
}

// deleteHeldSentSQL removes held rows sent longer than the retention ago,
// in bounded batches.
const deleteHeldSentSQL = `
DELETE FROM bridge.outbox_held
WHERE id IN (SELECT id FROM bridge.outbox_held WHERE status = 'SENT' AND sent_at < now() - $1::interval
             ORDER BY sent_at LIMIT $2 FOR UPDATE SKIP LOCKED)`

// DeleteHeldSent deletes up to limit held rows sent before the retention
// and returns how many.
func DeleteHeldSent(ctx context.Context, db DB, retention time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, deleteHeldSentSQL, Interval(retention), limit)
	if err != nil {
		return 0, fmt.Errorf("delete sent held outbox rows: %w", err)
	}
	return tag.RowsAffected(), nil
}
