package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/contract"
)

// History: a subscription created with --since starts with every retained
// matching event since then, then the live ones, per (subscription, asset)
// in asset_seq order with no gap and no duplicate at the seam.
//
// Where the history comes from: the retained outbox rows, not Kafka. They
// hold every field a delivery needs (dedup id, asset_seq, payload, trace
// context), they are read in the same PostgreSQL as the deliveries they
// become — so a batch's copy and its cursor commit together, and a crashed
// backfill resumes where its last batch committed — and the table's unique
// (asset, asset_seq) index gives the asset order for free. The cost: history
// reaches back only as far as SENT rows are kept (RELAY_RETENTION, 24h by
// default), where the topic's retention usually reaches further.
//
// The seam: the subscription is routed live by the consumer from the moment
// it commits. The copy takes the outbox rows up to a bound (the outbox
// sequence's last value, read after that commit): a row above it was
// written after the subscription existed, so the consumer routes it; a row
// at or below it may be routed too (it was not consumed yet), and then the
// copy and the live fan-out write the same (subscription, event_id), which
// the deliveries' unique key turns into one, in the history's place. Nothing is missed either: a
// row committed before the subscription is visible to every batch, since
// each batch runs after that commit.
//
// The order: the copy numbers its deliveries from deliveries_history_seq,
// below every seq the live fan-out takes, and the subscription is not
// claimed until the copy is done (claimSubscriptionsSQL), so in each stream
// the history goes out first, in asset_seq order, then what the consumer
// queued meanwhile. Holding it back costs only this subscription; the
// consumer's fan-out to everyone goes on.

// historyColumn is the subscription's backfill as its JSON (nil: none).
const historyColumn = `CASE WHEN s.history_since IS NULL THEN NULL
            ELSE jsonb_build_object('since', s.history_since, 'copied', s.history_copied, 'done_at', s.history_done_at)
       END AS history`

// History is a subscription's backfill: since when, how many deliveries it
// has copied so far, when it finished (nil: still copying; the
// subscription's deliveries wait for it).
type History struct {
	Since  time.Time  `json:"since"`
	Copied int64      `json:"copied"`
	DoneAt *time.Time `json:"done_at,omitempty"`
}

// ParseSince reads --since / "since": an RFC 3339 time or a duration before
// now, not in the future.
func ParseSince(v string, now time.Time) (time.Time, error) {
	t, err := parseBound("since", v, now)
	var we *WindowError
	if errors.As(err, &we) {
		return t, &ValidationError{Field: "since", Problem: we.Message}
	}
	if err != nil {
		return t, err
	}
	if t.After(now) {
		return t, &ValidationError{Field: "since", Value: t.UTC().Format(time.RFC3339), Problem: "is in the future"}
	}
	return t, nil
}

// checkSince refuses a since after the database's clock (the one the
// outbox's created_at is written by).
func checkSince(ctx context.Context, tx pgx.Tx, since time.Time) error {
	var future bool
	if err := tx.QueryRow(ctx, `SELECT $1::timestamptz > now()`, since).Scan(&future); err != nil {
		return err
	}
	if future {
		return &ValidationError{Field: "since", Value: since.UTC().Format(time.RFC3339), Problem: "is in the future"}
	}
	return nil
}

// pickHistorySQL takes one subscription whose history is still to copy; a
// replica copying another one's is skipped, not waited for.
const pickHistorySQL = `
SELECT s.id::text, s.event_types, coalesce(s.topic, ''), s.history_since,
       coalesce(s.history_upto, (SELECT coalesce(pg_sequence_last_value('bridge.outbox_log_seq'), 0))),
       coalesce(s.history_asset, ''), coalesce(s.history_asset_seq, 0)
FROM bridge.subscriptions s
WHERE s.history_since IS NOT NULL AND s.history_done_at IS NULL
ORDER BY s.created_at
LIMIT 1
FOR UPDATE SKIP LOCKED`

// scanHistorySQL reads the next $3 outbox rows after the cursor ($1, $2) in
// (asset, asset_seq) order, on the table's unique index outbox_asset_seq.
// It bounds the rows looked at, not the rows that match, so one batch costs
// the same however few rows match.
const scanHistorySQL = `
SELECT o.id::text AS id, o.seq, o.topic, o.asset_id, o.asset_seq, o.event_type, o.payload::text AS payload,
       o.created_at, coalesce(o.traceparent, '') AS traceparent, coalesce(o.tracestate, '') AS tracestate,
       o.status, coalesce(o.asset_id, '') AS asset_key
FROM bridge.outbox o
WHERE (coalesce(o.asset_id, ''), o.asset_seq) > ($1::text, $2::bigint)
ORDER BY coalesce(o.asset_id, ''), o.asset_seq
LIMIT $3`

// topicConsumedSQL: has the consumer taken in records of this topic? A
// subscription without a topic matches every topic, but the live fan-out
// only ever routes the topics the consumer reads (CONSUMER_TOPICS); history
// from any other topic would be events it would never have been sent.
const topicConsumedSQL = `SELECT EXISTS (SELECT 1 FROM bridge.consumer_inbox WHERE topic = $1)`

// insertHistorySQL writes the copied deliveries of subscription $1, numbered
// from deliveries_history_seq in the arrays' order (nextval is evaluated
// above the sort). A delivery the live fan-out already wrote for one of
// these events is renumbered into the history's place instead of kept
// where it was: kept, it would go out after a later event of its asset that
// only the copy wrote (the e2e test saw asset_seq 35 before 31). It is still
// untouched — the subscription is not claimed while its history is copied
// — and the guard says so.
const insertHistorySQL = `
INSERT INTO bridge.deliveries (seq, subscription_id, event_id, event_type, topic, asset_id, asset_seq,
                               payload, event_created_at, traceparent, tracestate)
SELECT nextval('bridge.deliveries_history_seq'), $1::uuid, e.event_id, e.event_type, e.topic, e.asset_id, e.asset_seq,
       e.payload::jsonb, e.event_created_at, nullif(e.traceparent, ''), nullif(e.tracestate, '')
FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::timestamptz[], $9::text[], $10::text[])
  WITH ORDINALITY AS e(event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at, traceparent, tracestate, ord)
ORDER BY e.ord
ON CONFLICT (subscription_id, event_id) DO UPDATE SET seq = EXCLUDED.seq
  WHERE bridge.deliveries.status = 'pending' AND bridge.deliveries.attempts = 0`

// advanceHistorySQL records a batch: the bound, the cursor, the count, and
// the end when the scan ran out of rows.
const advanceHistorySQL = `
UPDATE bridge.subscriptions
SET history_upto = $2, history_asset = $3, history_asset_seq = $4, history_copied = history_copied + $5,
    history_done_at = CASE WHEN $6::boolean THEN now() END, updated_at = now()
WHERE id = $1`

type historyRow struct {
	ID          string    `db:"id"`
	Seq         int64     `db:"seq"`
	Topic       string    `db:"topic"`
	AssetID     *string   `db:"asset_id"`
	AssetSeq    int64     `db:"asset_seq"`
	EventType   string    `db:"event_type"`
	Payload     string    `db:"payload"`
	CreatedAt   time.Time `db:"created_at"`
	Traceparent string    `db:"traceparent"`
	Tracestate  string    `db:"tracestate"`
	Status      string    `db:"status"`
	AssetKey    string    `db:"asset_key"`
}

// HistoryBatch is what one CopyHistory call did.
type HistoryBatch struct {
	SubscriptionID string
	Scanned        int // outbox rows looked at
	Copied         int // deliveries written
	Done           bool
}

// CopyHistory copies one batch (at most batch outbox rows looked at) of the
// history of one subscription that needs it, in one transaction with its
// cursor. ok is false when no subscription needs any.
func (s *DeliveryStore) CopyHistory(ctx context.Context, batch int) (b HistoryBatch, ok bool, err error) {
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var (
			types            []string
			topic, cursorKey string
			since            time.Time
			upto, cursorSeq  int64
		)
		err := tx.QueryRow(ctx, pickHistorySQL).Scan(&b.SubscriptionID, &types, &topic, &since, &upto, &cursorKey, &cursorSeq)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		ok = true
		rows, err := tx.Query(ctx, scanHistorySQL, cursorKey, cursorSeq, batch)
		if err != nil {
			return err
		}
		scanned, err := pgx.CollectRows(rows, pgx.RowToStructByName[historyRow])
		if err != nil {
			return err
		}
		b.Scanned = len(scanned)
		b.Done = len(scanned) < batch
		filter := contract.Filter{Enabled: true, EventTypes: types, Topic: topic}
		consumed := map[string]bool{}
		var f Fanout
		for _, r := range scanned {
			// NEW rows count: one may already be on its way through Kafka and
			// routed before this subscription existed. FAILED ones never
			// reached anyone.
			if r.Status == "FAILED" || r.Seq > upto || r.CreatedAt.Before(since) || !filter.Matches(r.Topic, r.EventType) {
				continue
			}
			c, seen := consumed[r.Topic]
			if !seen {
				if err := tx.QueryRow(ctx, topicConsumedSQL, r.Topic).Scan(&c); err != nil {
					return err
				}
				consumed[r.Topic] = c
			}
			if !c {
				continue
			}
			seq := r.AssetSeq
			f.AddEvent(Event{ID: r.ID, Type: r.EventType, Topic: r.Topic, AssetID: r.AssetID, AssetSeq: &seq,
				Payload: r.Payload, CreatedAt: r.CreatedAt, Traceparent: r.Traceparent, Tracestate: r.Tracestate})
		}
		if len(f.eventID) > 0 {
			tag, err := tx.Exec(ctx, insertHistorySQL, b.SubscriptionID, f.eventID, f.eventType, f.topic, f.assetID, f.assetSeq,
				f.payload, f.createdAt, f.traceparent, f.tracestate)
			if err != nil {
				return err
			}
			b.Copied = int(tag.RowsAffected())
		}
		if len(scanned) > 0 {
			last := scanned[len(scanned)-1]
			cursorKey, cursorSeq = last.AssetKey, last.AssetSeq
		}
		_, err = tx.Exec(ctx, advanceHistorySQL, b.SubscriptionID, upto, cursorKey, cursorSeq, b.Copied, b.Done)
		return err
	})
	if err != nil {
		return HistoryBatch{}, false, fmt.Errorf("copy subscription history: %w", err)
	}
	return b, ok, nil
}

// historyRemainingSQL estimates, per subscription still copying, the outbox
// rows after its cursor: the copy's progress for the metrics. Counting by
// the index from the cursor is bounded by the retained outbox.
const historyRemainingSQL = `
SELECT s.id::text,
       (SELECT count(*) FROM bridge.outbox o
        WHERE (coalesce(o.asset_id, ''), o.asset_seq) > (coalesce(s.history_asset, ''), coalesce(s.history_asset_seq, 0)))
FROM bridge.subscriptions s
WHERE s.history_since IS NOT NULL AND s.history_done_at IS NULL`

// HistoryRemaining returns, per subscription whose history is still being
// copied, how many outbox rows its copy has yet to look at.
func HistoryRemaining(ctx context.Context, db DB) (map[string]int64, error) {
	rows, err := db.Query(ctx, historyRemainingSQL)
	if err != nil {
		return nil, fmt.Errorf("subscription history progress: %w", err)
	}
	out := map[string]int64{}
	var id string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil }); err != nil {
		return nil, fmt.Errorf("subscription history progress: %w", err)
	}
	return out, nil
}

// HistoryJob is a subscription whose history is still to copy, for a copy
// that reads it from Kafka (the fast lane's installations: kafkawindow).
type HistoryJob struct {
	SubscriptionID string    `db:"id"`
	EventTypes     []string  `db:"event_types"`
	Topic          string    `db:"topic"`
	Since          time.Time `db:"history_since"`
	// AgeSeconds is how long ago the subscription was created, by the
	// database's clock (the one its created_at is written by).
	AgeSeconds float64 `db:"age"`
}

// pendingHistorySQL is the subscriptions whose history is not done, oldest
// first.
const pendingHistorySQL = `
SELECT s.id::text AS id, s.event_types, coalesce(s.topic, '') AS topic, s.history_since,
       extract(epoch FROM now() - s.created_at)::float8 AS age
FROM bridge.subscriptions s
WHERE s.history_since IS NOT NULL AND s.history_done_at IS NULL
ORDER BY s.created_at`

// historyCopyLockSQL and historyCopyUnlockSQL: the copier of a
// subscription's history from the topics holds a session advisory lock
// (class 7411007) on a connection of its own for the whole copy, so a second
// replica's copier skips that subscription instead of reading the same
// window and writing it again; a copier that dies ends its session, which
// frees the lock for the next one.
const (
	historyCopyLockSQL   = `SELECT pg_try_advisory_lock(7411007, hashtext($1))`
	historyCopyUnlockSQL = `SELECT pg_advisory_unlock(7411007, hashtext($1))`
)

// TakeHistory returns the oldest subscription whose history is still to
// copy and that no other copier holds, locked for this one until release
// is called (the lock's connection goes back to the pool then); ok is false
// when there is none.
func TakeHistory(ctx context.Context, pool *pgxpool.Pool) (j HistoryJob, release func(), ok bool, err error) {
	rows, err := pool.Query(ctx, pendingHistorySQL)
	if err != nil {
		return j, nil, false, fmt.Errorf("find a subscription history to copy: %w", err)
	}
	jobs, err := pgx.CollectRows(rows, pgx.RowToStructByName[HistoryJob])
	if err != nil || len(jobs) == 0 {
		return j, nil, false, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return j, nil, false, fmt.Errorf("find a subscription history to copy: %w", err)
	}
	for _, job := range jobs {
		var locked bool
		if err := conn.QueryRow(ctx, historyCopyLockSQL, job.SubscriptionID).Scan(&locked); err != nil {
			conn.Release()
			return j, nil, false, fmt.Errorf("lock subscription %s's history: %w", job.SubscriptionID, err)
		}
		if locked {
			release = func() {
				// A failed unlock leaves the lock with the session: the
				// connection is closed rather than handed back holding it.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if _, err := conn.Exec(ctx, historyCopyUnlockSQL, job.SubscriptionID); err != nil {
					conn.Conn().Close(ctx)
				}
				conn.Release()
			}
			return job, release, true, nil
		}
	}
	conn.Release()
	return j, nil, false, nil
}

// historyProgressSQL records how many deliveries the copy in progress has
// written so far (subscriptions show, the console).
const historyProgressSQL = `
UPDATE bridge.subscriptions SET history_copied = $2
WHERE id = $1 AND history_done_at IS NULL`

// NoteHistoryProgress records, in q's transaction, that the copy of
// subscriptionID's history has written copied deliveries so far.
func NoteHistoryProgress(ctx context.Context, q Querier, subscriptionID string, copied int64) error {
	if _, err := q.Exec(ctx, historyProgressSQL, subscriptionID, copied); err != nil {
		return fmt.Errorf("note subscription history progress: %w", err)
	}
	return nil
}

// InsertHistory writes f's events as history deliveries of subscriptionID
// (insertHistorySQL: numbered below every live delivery, a live one already
// written renumbered into the history's place). Writing the same events
// again is harmless: each is renumbered, in f's order, and never doubled.
func InsertHistory(ctx context.Context, q Querier, subscriptionID string, f *Fanout) (int64, error) {
	if len(f.eventID) == 0 {
		return 0, nil
	}
	tag, err := q.Exec(ctx, insertHistorySQL, subscriptionID, f.eventID, f.eventType, f.topic, f.assetID, f.assetSeq,
		f.payload, f.createdAt, f.traceparent, f.tracestate)
	if err != nil {
		return 0, fmt.Errorf("copy subscription history: %w", err)
	}
	return tag.RowsAffected(), nil
}

const finishHistorySQL = `
UPDATE bridge.subscriptions
SET history_copied = $2, history_done_at = now(), updated_at = now()
WHERE id = $1 AND history_done_at IS NULL`

// FinishHistory marks a subscription's history copied (copied deliveries):
// from its commit the claim serves the subscription.
func (s *DeliveryStore) FinishHistory(ctx context.Context, subscriptionID string, copied int64) error {
	if _, err := s.db.Exec(ctx, finishHistorySQL, subscriptionID, copied); err != nil {
		return fmt.Errorf("finish subscription history: %w", err)
	}
	return nil
}
