package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The way into the delivery queue: the consumer's fan-out of one Kafka
// record into one bridge.deliveries row per matching subscription. The
// stream rows follow from the insert trigger (deliveries_streams).

// insertDeliveriesSQL writes one delivery per (event, subscription) pair in
// one statement: $1..$9 are the events (each payload sent once), $10/$11 the
// pairs as (event index, subscription id), in record order. ORDER BY m.ord
// makes the seq default (nextval, evaluated above the sort) follow that
// order, so a (subscription, asset) stream's seq is Kafka's partition order.
// ON CONFLICT covers a record seen again after its inbox row was pruned while
// its deliveries still exist.
const insertDeliveriesSQL = `
WITH ev AS (
  SELECT *
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[],
              $6::text[], $7::timestamptz[], $8::text[], $9::text[])
    WITH ORDINALITY AS e(event_id, event_type, topic, asset_id, asset_seq,
                         payload, event_created_at, traceparent, tracestate, idx)
), m AS (
  SELECT * FROM unnest($10::bigint[], $11::uuid[]) WITH ORDINALITY AS m(idx, subscription_id, ord)
)
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq,
                               payload, event_created_at, traceparent, tracestate)
SELECT m.subscription_id, ev.event_id, ev.event_type, ev.topic, ev.asset_id, ev.asset_seq,
       ev.payload::jsonb, ev.event_created_at, ev.traceparent, ev.tracestate
FROM m JOIN ev ON ev.idx = m.idx
ORDER BY m.ord
ON CONFLICT (subscription_id, event_id) DO NOTHING`

// Event is what a delivery carries of its event.
type Event struct {
	ID          string // the dedup id: webhook-id on every attempt
	Type        string
	Topic       string
	AssetID     *string
	AssetSeq    *int64
	Payload     string // JSON
	CreatedAt   time.Time
	Traceparent string
	Tracestate  string
}

// Fanout collects a batch's deliveries: the events that have at least one,
// and the (event, subscription) pairs in record order. The zero value is
// empty and ready.
type Fanout struct {
	eventID, eventType, topic, payload []string
	assetID, traceparent, tracestate   []*string
	assetSeq                           []*int64
	createdAt                          []time.Time
	pairEvent                          []int64 // 1-based index into the event arrays
	pairSub                            []string
}

// AddEvent adds an event and returns the handle Deliver takes.
func (f *Fanout) AddEvent(ev Event) int64 {
	f.eventID = append(f.eventID, ev.ID)
	f.eventType = append(f.eventType, ev.Type)
	f.topic = append(f.topic, ev.Topic)
	f.payload = append(f.payload, ev.Payload)
	f.assetID = append(f.assetID, ev.AssetID)
	f.assetSeq = append(f.assetSeq, ev.AssetSeq)
	f.createdAt = append(f.createdAt, ev.CreatedAt)
	f.traceparent = append(f.traceparent, nullable(ev.Traceparent))
	f.tracestate = append(f.tracestate, nullable(ev.Tracestate))
	return int64(len(f.eventID))
}

// Deliver queues the event (a handle from AddEvent) to a subscription. The
// order of Deliver calls is the order of the deliveries' seq.
func (f *Fanout) Deliver(event int64, subscriptionID string) {
	f.pairEvent = append(f.pairEvent, event)
	f.pairSub = append(f.pairSub, subscriptionID)
}

// Len is the number of deliveries queued.
func (f *Fanout) Len() int { return len(f.pairEvent) }

// Enqueue writes the fan-out's deliveries in q's transaction (the consumer's,
// which also holds the inbox rows and is committed before the offsets).
func Enqueue(ctx context.Context, q Querier, f *Fanout) error {
	if f.Len() == 0 {
		return nil
	}
	if _, err := q.Exec(ctx, insertDeliveriesSQL, f.eventID, f.eventType, f.topic, f.assetID, f.assetSeq,
		f.payload, f.createdAt, f.traceparent, f.tracestate, f.pairEvent, f.pairSub); err != nil {
		return fmt.Errorf("insert deliveries: %w", err)
	}
	return nil
}

// EnqueueCount is Enqueue returning how many deliveries were written (a
// pair whose (subscription, event) already has a row writes none).
func EnqueueCount(ctx context.Context, q Querier, f *Fanout) (int64, error) {
	if f.Len() == 0 {
		return 0, nil
	}
	tag, err := q.Exec(ctx, insertDeliveriesSQL, f.eventID, f.eventType, f.topic, f.assetID, f.assetSeq,
		f.payload, f.createdAt, f.traceparent, f.tracestate, f.pairEvent, f.pairSub)
	if err != nil {
		return 0, fmt.Errorf("insert deliveries: %w", err)
	}
	return tag.RowsAffected(), nil
}

// QueueEnqueue queues Enqueue's statement on b, for a caller that sends it
// with its commit in one round trip (the consumer). Nothing is queued for an
// empty fan-out.
func QueueEnqueue(b *pgx.Batch, f *Fanout) {
	if f.Len() == 0 {
		return
	}
	b.Queue(insertDeliveriesSQL, f.eventID, f.eventType, f.topic, f.assetID, f.assetSeq,
		f.payload, f.createdAt, f.traceparent, f.tracestate, f.pairEvent, f.pairSub).Exec(func(pgconn.CommandTag) error { return nil })
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Copier is what CopyPending needs; *pgxpool.Pool satisfies it.
type Copier interface {
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

// Pending is one delivery for CopyPending.
type Pending struct {
	SubscriptionID string
	Event          Event
}

// pendingColumns are the columns CopyPending fills; the rest take their
// defaults (status pending, seq in copy order).
var pendingColumns = []string{"subscription_id", "event_id", "event_type", "topic", "asset_id", "asset_seq",
	"payload", "event_created_at", "traceparent", "tracestate"}

// CopyPending loads deliveries with COPY, in slice order (their seq follows
// it). It is how a benchmark builds a backlog quickly; the pipeline enqueues
// through Enqueue.
func CopyPending(ctx context.Context, db Copier, rows []Pending) error {
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i == len(rows) {
			return nil, nil
		}
		r := rows[i]
		i++
		return []any{r.SubscriptionID, r.Event.ID, r.Event.Type, r.Event.Topic, r.Event.AssetID, r.Event.AssetSeq,
			r.Event.Payload, r.Event.CreatedAt, nullable(r.Event.Traceparent), nullable(r.Event.Tracestate)}, nil
	})
	if _, err := db.CopyFrom(ctx, pgx.Identifier{"bridge", "deliveries"}, pendingColumns, src); err != nil {
		return fmt.Errorf("copy deliveries: %w", err)
	}
	return nil
}
