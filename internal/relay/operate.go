package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Stats is what `bridge outbox stats` shows and the metrics export.
type Stats struct {
	ByStatus map[string]int64 `json:"by_status"`
	// OldestNewAgeSeconds is the age of the oldest NEW row: the relay lag an
	// operator alerts on (0 when nothing is waiting).
	OldestNewAgeSeconds float64          `json:"oldest_new_age_seconds"`
	FailedByTopic       map[string]int64 `json:"failed_by_topic"`
}

// ReadStats reads outbox counts by status, the oldest NEW row's age and
// FAILED rows by topic.
func ReadStats(ctx context.Context, pool *pgxpool.Pool) (Stats, error) {
	st := Stats{ByStatus: map[string]int64{"NEW": 0, "SENT": 0, "FAILED": 0}, FailedByTopic: map[string]int64{}}
	if err := scanCounts(ctx, pool, statsByStatusSQL, st.ByStatus); err != nil {
		return st, fmt.Errorf("outbox stats: %w", err)
	}
	if err := pool.QueryRow(ctx, oldestNewSQL).Scan(&st.OldestNewAgeSeconds); err != nil {
		return st, fmt.Errorf("outbox stats: %w", err)
	}
	if err := scanCounts(ctx, pool, failedByTopicSQL, st.FailedByTopic); err != nil {
		return st, fmt.Errorf("outbox stats: %w", err)
	}
	return st, nil
}

func scanCounts(ctx context.Context, pool *pgxpool.Pool, sql string, into map[string]int64) error {
	rows, err := pool.Query(ctx, sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			return err
		}
		into[k] = n
	}
	return rows.Err()
}

// FailedRow is a parked row as operators see it. Payload is empty unless
// asked for: the listing is for triage, not for reading event contents.
type FailedRow struct {
	ID        uuid.UUID  `json:"id"`
	Seq       int64      `json:"seq"`
	AssetSeq  int64      `json:"asset_seq"`
	Topic     string     `json:"topic"`
	AssetID   *string    `json:"asset_id"`
	EventType string     `json:"event_type"`
	Attempts  int        `json:"attempts"`
	LastError string     `json:"last_error"`
	CreatedAt time.Time  `json:"created_at"`
	FailedAt  *time.Time `json:"failed_at"`
	Payload   *string    `json:"payload,omitempty"`
}

// ListFailed returns up to limit FAILED rows with seq above afterSeq, in seq
// order (topic "" = all; afterSeq 0 = from the start).
func ListFailed(ctx context.Context, pool *pgxpool.Pool, topic string, limit int, withPayload bool, afterSeq int64) ([]FailedRow, error) {
	rows, err := pool.Query(ctx, listFailedSQL, topic, limit, withPayload, afterSeq)
	if err != nil {
		return nil, fmt.Errorf("list failed outbox rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (FailedRow, error) {
		var f FailedRow
		err := r.Scan(&f.ID, &f.Seq, &f.AssetSeq, &f.Topic, &f.AssetID, &f.EventType, &f.Attempts, &f.LastError, &f.CreatedAt, &f.FailedAt, &f.Payload)
		return f, err
	})
	if err != nil {
		return nil, fmt.Errorf("list failed outbox rows: %w", err)
	}
	return out, nil
}

// NotReplayed is an id ReplayIDs left alone, and why.
type NotReplayed struct {
	ID     uuid.UUID `json:"id"`
	Reason string    `json:"reason"` // "no such outbox row", "is SENT, not FAILED", …
}

// ReplayIDs returns the given FAILED rows to NEW with attempts reset. They
// keep their seq and their trace: the replayed send continues the original
// trace. Every other id is reported with the reason it was left alone (it
// does not exist, or is not FAILED): an id mistyped or already replayed
// used to vanish into "replayed 0 row(s)".
func ReplayIDs(ctx context.Context, pool *pgxpool.Pool, ids []uuid.UUID) (replayed []uuid.UUID, notReplayed []NotReplayed, err error) {
	rows, err := pool.Query(ctx, replayByIDSQL, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("replay outbox rows: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var ok bool
		var status *string
		if err := rows.Scan(&id, &ok, &status); err != nil {
			return nil, nil, fmt.Errorf("replay outbox rows: %w", err)
		}
		switch {
		case ok:
			replayed = append(replayed, id)
		case status == nil:
			notReplayed = append(notReplayed, NotReplayed{ID: id, Reason: "no such outbox row"})
		default:
			notReplayed = append(notReplayed, NotReplayed{ID: id, Reason: "is " + *status + ", not FAILED"})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("replay outbox rows: %w", err)
	}
	return replayed, notReplayed, nil
}

// ReplayAllFailed returns every FAILED row (of topic, if not "", and failed
// within since, if > 0) to NEW.
func ReplayAllFailed(ctx context.Context, pool *pgxpool.Pool, topic string, since time.Duration) (int64, error) {
	var sinceArg *string
	if since > 0 {
		s := interval(since)
		sinceArg = &s
	}
	tag, err := pool.Exec(ctx, replayAllSQL, topic, sinceArg)
	if err != nil {
		return 0, fmt.Errorf("replay outbox rows: %w", err)
	}
	return tag.RowsAffected(), nil
}
