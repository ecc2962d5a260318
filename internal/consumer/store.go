package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// subscription is one row of bridge.subscriptions as the router sees it.
type subscription struct {
	id     string
	filter contract.Filter
}

// outcome is what storing did with one event; applied to the events only
// after the transaction committed, so a retried batch starts clean.
type outcome struct {
	fresh      bool
	deliveries int
	rejected   string // PostgreSQL refused the record: dead-letter it
}

// queryer is what both a transaction and a savepoint offer.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// store writes the batch's good events in one transaction. If PostgreSQL
// refuses the data of some record (classify: a data exception such as a
// \u0000 escape jsonb refuses, an index entry too large, a constraint the
// record's own values violate), the batch is split until the offending
// records are alone (storeSplit): only they are dead-lettered, with
// PostgreSQL's reason, and their neighbours go through. Any other error is
// returned, and the whole batch is retried.
func (c *Consumer) store(ctx context.Context, evs []*event) error {
	outs, err := c.storeBatch(ctx, evs)
	if err != nil && classify(err) == recordFault {
		c.logger.WarnContext(ctx, "PostgreSQL refused a record of the batch; splitting the batch to isolate it",
			"err", err, "records", len(evs))
		outs, err = c.storeSplit(ctx, evs)
	}
	if err != nil {
		return err
	}
	for i, ev := range evs {
		ev.duplicate = !outs[i].fresh && outs[i].rejected == ""
		ev.deliveries = outs[i].deliveries
		if outs[i].rejected != "" {
			ev.badReason = outs[i].rejected
		}
	}
	return nil
}

// storeBatch is the fast path: the batch's transaction in two round trips
// — BEGIN, the subscriptions and the inbox insert in one pipeline, then the
// deliveries and COMMIT in another — instead of five (BEGIN, each statement,
// COMMIT). On a busy machine every round trip is a wait for this process to
// be scheduled again while the transaction holds its stream rows, and the
// consumer's loop is serial, so each one was added to every event's latency
// (bench pipeline: ~19 batches/s of ~53 events, consumer stage p50 69 ms).
// A statement that fails skips the rest of its pipeline (PostgreSQL ignores
// everything up to the pipeline's sync after an error), so COMMIT runs only
// if the insert succeeded; a transaction left open is rolled back before the
// connection goes back to the pool.
func (c *Consumer) storeBatch(ctx context.Context, evs []*event) (_ []outcome, err error) {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire a connection for the batch: %w", err)
	}
	defer func() {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			if _, rerr := conn.Exec(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil {
				// The connection's state is unknown: do not hand it out again.
				_ = conn.Conn().Close(context.WithoutCancel(ctx))
			}
		}
		conn.Release()
	}()
	var routes []store.Route
	var inserted []string
	first := &pgx.Batch{}
	first.Queue("BEGIN")
	store.QueueRoutes(first, &routes)
	first.Queue(insertInbox, inboxArgs(evs)...).Query(func(rows pgx.Rows) error {
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("insert inbox rows: %w", err)
		}
		inserted = ids
		return nil
	})
	if err := conn.SendBatch(ctx, first).Close(); err != nil {
		return nil, fmt.Errorf("store batch (begin, subscriptions, inbox): %w", err)
	}
	outs := make([]outcome, len(evs))
	f := fanout(evs, inserted, outs, toSubscriptions(routes))
	second := &pgx.Batch{}
	store.QueueEnqueue(second, f)
	second.Queue("COMMIT")
	if err := conn.SendBatch(ctx, second).Close(); err != nil {
		return nil, fmt.Errorf("store batch (deliveries, commit): %w", err)
	}
	return outs, nil
}

// storeSplit stores the batch in one transaction by halves: a range of
// events is written under a savepoint; when PostgreSQL refuses it for the
// data's sake the savepoint is rolled back and each half is tried on its
// own, left before right, so the deliveries' seq keeps the batch's order. A
// single event refused is rejected (dead-lettered with the reason). k bad
// records among n cost about 2·k·log2(n) savepoints instead of n. It is the
// slow path, taken only after the batch as a whole was refused.
func (c *Consumer) storeSplit(ctx context.Context, evs []*event) ([]outcome, error) {
	return c.inBatchTransaction(ctx, evs, func(tx pgx.Tx, subs []subscription, outs []outcome) error {
		var split func(lo, hi int) error
		split = func(lo, hi int) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return fmt.Errorf("savepoint: %w", err)
			}
			err = insertEvents(ctx, sp, evs[lo:hi], outs[lo:hi], subs)
			if err == nil {
				if err := sp.Commit(ctx); err != nil {
					return fmt.Errorf("release savepoint: %w", err)
				}
				return nil
			}
			if classify(err) != recordFault {
				return err
			}
			if rerr := sp.Rollback(ctx); rerr != nil {
				return fmt.Errorf("rollback to savepoint: %w", rerr)
			}
			clear(outs[lo:hi])
			if hi-lo == 1 {
				outs[lo] = outcome{rejected: "PostgreSQL rejected the record: " + pgMessage(err)}
				c.logger.WarnContext(ctx, "record rejected by PostgreSQL", "dedup_id", evs[lo].dedupID, "err", err)
				return nil
			}
			mid := lo + (hi-lo)/2
			if err := split(lo, mid); err != nil {
				return err
			}
			return split(mid, hi)
		}
		return split(0, len(evs))
	})
}

// inBatchTransaction is the slow path's one transaction, as storeBatch's:
// the subscriptions are read inside it, fill writes the events and one
// outcome each, and nothing is committed unless fill succeeds.
func (c *Consumer) inBatchTransaction(ctx context.Context, evs []*event, fill func(tx pgx.Tx, subs []subscription, outs []outcome) error) ([]outcome, error) {
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin batch transaction: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	subs, err := loadSubscriptions(ctx, tx)
	if err != nil {
		return nil, err
	}
	outs := make([]outcome, len(evs))
	if err := fill(tx, subs, outs); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit batch transaction: %w", err)
	}
	return outs, nil
}

func loadSubscriptions(ctx context.Context, q queryer) ([]subscription, error) {
	routes, err := store.Routes(ctx, q)
	if err != nil {
		return nil, err
	}
	return toSubscriptions(routes), nil
}

func toSubscriptions(routes []store.Route) []subscription {
	subs := make([]subscription, len(routes))
	for i, r := range routes {
		subs[i] = subscription{id: r.ID, filter: contract.Filter{Enabled: r.Enabled, EventTypes: r.EventTypes, Topic: r.Topic}}
	}
	return subs
}

// insertEvents records evs in the inbox and writes the deliveries of the ones
// that were new, filling outs (the slow path's, one savepoint per range).
func insertEvents(ctx context.Context, q queryer, evs []*event, outs []outcome, subs []subscription) error {
	rows, err := q.Query(ctx, insertInbox, inboxArgs(evs)...)
	if err != nil {
		return fmt.Errorf("insert inbox rows: %w", err)
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("insert inbox rows: %w", err)
	}
	return store.Enqueue(ctx, q, fanout(evs, inserted, outs, subs))
}

// inboxArgs are insertInbox's arguments for evs.
func inboxArgs(evs []*event) []any {
	n := len(evs)
	ids, topics := make([]string, n), make([]string, n)
	parts, offsets := make([]int32, n), make([]int64, n)
	for i, ev := range evs {
		ids[i], topics[i] = ev.dedupID, ev.rec.Topic
		parts[i], offsets[i] = ev.rec.Partition, ev.rec.Offset
	}
	return []any{ids, topics, parts, offsets}
}

// fanout builds the deliveries of the events the inbox insert returned
// (inserted: new to the inbox) and fills outs.
func fanout(evs []*event, inserted []string, outs []outcome, subs []subscription) *store.Fanout {
	fresh := make(map[string]bool, len(inserted))
	for _, id := range inserted {
		fresh[id] = true
	}
	var f store.Fanout
	for i, ev := range evs {
		if !fresh[ev.dedupID] {
			continue
		}
		outs[i].fresh = true
		idx := int64(0)
		for _, s := range subs {
			if !s.filter.Matches(ev.rec.Topic, ev.eventType) {
				continue
			}
			if idx == 0 {
				idx = f.AddEvent(store.Event{
					ID: ev.dedupID, Type: ev.eventType, Topic: ev.rec.Topic, AssetID: ev.assetID, AssetSeq: ev.assetSeq,
					Payload: ev.payload, CreatedAt: ev.createdAt, Traceparent: ev.traceparent, Tracestate: ev.tracestate,
				})
			}
			f.Deliver(idx, s.id)
			outs[i].deliveries++
		}
	}
	return &f
}

func pgMessage(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Sprintf("%s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	}
	return err.Error()
}
