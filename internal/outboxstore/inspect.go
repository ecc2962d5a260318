package outboxstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The operator queries behind the console's pages (internal/console): the
// same rows `bridge outbox failed` and the admin API list, with the filters
// a browser offers, one row's detail, and per-topic figures for the overview.

// failedMatchingWhere is the one definition of FailedFilter ($1 topic, $2
// asset, $3 event type, $4 error substring, $5/$6 failed_at range; empty and
// NULL match everything). The error text is matched with strpos, not LIKE:
// an operator pasting an error containing % or _ means those characters.
const failedMatchingWhere = `
status = 'FAILED'
  AND ($1 = '' OR topic = $1)
  AND ($2 = '' OR coalesce(asset_id, '') = $2)
  AND ($3 = '' OR event_type = $3)
  AND ($4 = '' OR strpos(lower(coalesce(last_error, '')), lower($4)) > 0)
  AND ($5::timestamptz IS NULL OR failed_at >= $5)
  AND ($6::timestamptz IS NULL OR failed_at < $6)`

const listFailedMatchingSQL = `
SELECT id, seq, asset_seq, topic, asset_id, event_type, attempts, coalesce(last_error, ''), created_at, failed_at
FROM bridge.outbox_held
WHERE` + failedMatchingWhere + `
  AND seq > $8
ORDER BY seq
LIMIT $7`

const countFailedMatchingSQL = `SELECT count(*) FROM bridge.outbox_held WHERE` + failedMatchingWhere

// replayMatchingSQL wakes the relays from the lowest seq it replayed (see
// replayByIDSQL).
const replayMatchingSQL = `
WITH r AS (
  UPDATE bridge.outbox_held
  SET status = 'NEW', attempts = 0, next_attempt_at = now(), failed_at = NULL, replayed_at = now()
  WHERE` + failedMatchingWhere + `
  RETURNING seq
)
SELECT count(*), bridge.wake_relays(min(seq)) FROM r`

const getRowSQL = `
SELECT id, seq, asset_seq, topic, asset_id, event_type, attempts, coalesce(last_error, ''), created_at, failed_at,
       CASE WHEN $2 THEN payload::text END, status, headers, coalesce(traceparent, ''),
       sent_at, replayed_at, kafka_partition, kafka_offset
FROM bridge.outbox WHERE id = $1`

const topicStatsSQL = `
SELECT topic,
       count(*) FILTER (WHERE status = 'NEW'),
       count(*) FILTER (WHERE status = 'SENT'),
       count(*) FILTER (WHERE status = 'FAILED'),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'NEW')), 0)::float8
FROM bridge.outbox
GROUP BY topic
ORDER BY topic`

// throughputSQL counts the events created in the window that their lanes
// have passed. The log records no per-event send time, so the latency
// percentiles are 0.
const throughputSQL = `
SELECT count(*), 0::float8, 0::float8
FROM bridge.outbox
WHERE status = 'SENT' AND created_at > now() - $1::interval`

// FailedFilter narrows FAILED rows. Zero fields match everything.
type FailedFilter struct {
	Topic     string
	AssetID   string
	EventType string
	// ErrorContains matches last_error case-insensitively (a substring, not
	// a pattern: % and _ are literal).
	ErrorContains string
	// FailedFrom / FailedTo bound failed_at (inclusive / exclusive).
	FailedFrom, FailedTo time.Time
}

func (f FailedFilter) args() []any {
	var from, to *time.Time
	if !f.FailedFrom.IsZero() {
		from = &f.FailedFrom
	}
	if !f.FailedTo.IsZero() {
		to = &f.FailedTo
	}
	return []any{f.Topic, f.AssetID, f.EventType, f.ErrorContains, from, to}
}

// ListFailedMatching returns up to limit FAILED rows matching f with seq
// above afterSeq, in seq order, without payloads.
func ListFailedMatching(ctx context.Context, db DB, f FailedFilter, limit int, afterSeq int64) ([]FailedRow, error) {
	rows, err := db.Query(ctx, listFailedMatchingSQL, append(f.args(), limit, afterSeq)...)
	if err != nil {
		return nil, fmt.Errorf("list failed outbox rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (FailedRow, error) {
		var f FailedRow
		err := r.Scan(&f.ID, &f.Seq, &f.AssetSeq, &f.Topic, &f.AssetID, &f.EventType, &f.Attempts, &f.LastError, &f.CreatedAt, &f.FailedAt)
		return f, err
	})
	if err != nil {
		return nil, fmt.Errorf("list failed outbox rows: %w", err)
	}
	return out, nil
}

// CountFailedMatching counts the FAILED rows matching f: what "replay all
// that match" would replay.
func CountFailedMatching(ctx context.Context, db DB, f FailedFilter) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, countFailedMatchingSQL, f.args()...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count failed outbox rows: %w", err)
	}
	return n, nil
}

// ReplayFailedMatching returns every FAILED row matching f to NEW (as
// ReplayIDs does) and reports how many.
func ReplayFailedMatching(ctx context.Context, db DB, f FailedFilter) (int64, error) {
	var n int64
	var woke *int64
	if err := db.QueryRow(ctx, replayMatchingSQL, f.args()...).Scan(&n, &woke); err != nil {
		return 0, fmt.Errorf("replay outbox rows: %w", err)
	}
	return n, nil
}

// Row is one outbox row in any status, as its detail page shows it.
// Payload is nil unless asked for.
type Row struct {
	FailedRow
	Status         string            `json:"status"`
	Headers        map[string]string `json:"headers"`
	Traceparent    string            `json:"traceparent,omitempty"`
	SentAt         *time.Time        `json:"sent_at,omitempty"`
	ReplayedAt     *time.Time        `json:"replayed_at,omitempty"`
	KafkaPartition *int32            `json:"kafka_partition,omitempty"`
	KafkaOffset    *int64            `json:"kafka_offset,omitempty"`
}

// TraceID is the row's trace id ("" when it carries no traceparent).
func (r *Row) TraceID() string {
	if len(r.Traceparent) == 55 {
		return r.Traceparent[3:35]
	}
	return ""
}

// GetRow reads one outbox row by id; pgx.ErrNoRows when there is none (SENT
// rows go after RELAY_RETENTION).
func GetRow(ctx context.Context, db DB, id uuid.UUID, withPayload bool) (*Row, error) {
	var r Row
	var hdr []byte
	err := db.QueryRow(ctx, getRowSQL, id, withPayload).Scan(&r.ID, &r.Seq, &r.AssetSeq, &r.Topic, &r.AssetID, &r.EventType,
		&r.Attempts, &r.LastError, &r.CreatedAt, &r.FailedAt, &r.Payload, &r.Status, &hdr, &r.Traceparent,
		&r.SentAt, &r.ReplayedAt, &r.KafkaPartition, &r.KafkaOffset)
	if err != nil {
		return nil, fmt.Errorf("read outbox row %s: %w", id, err)
	}
	if err := json.Unmarshal(hdr, &r.Headers); err != nil {
		return nil, fmt.Errorf("outbox row %s: headers: %w", id, err)
	}
	return &r, nil
}

// TopicStats is one topic's rows by status and its oldest NEW row's age.
type TopicStats struct {
	Topic               string  `json:"topic"`
	New                 int64   `json:"new"`
	Sent                int64   `json:"sent"`
	Failed              int64   `json:"failed"`
	OldestNewAgeSeconds float64 `json:"oldest_new_age_seconds"`
}

// ReadTopicStats reads TopicStats for every topic in the outbox, by topic.
// It counts the whole table (SENT rows until RELAY_RETENTION), so callers
// sample it rather than run it per request.
func ReadTopicStats(ctx context.Context, db DB) ([]TopicStats, error) {
	rows, err := db.Query(ctx, topicStatsSQL)
	if err != nil {
		return nil, fmt.Errorf("outbox topic stats: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TopicStats, error) {
		var s TopicStats
		err := r.Scan(&s.Topic, &s.New, &s.Sent, &s.Failed, &s.OldestNewAgeSeconds)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox topic stats: %w", err)
	}
	return out, nil
}

// Throughput is what the relays (all replicas) sent in a recent window.
type Throughput struct {
	Window time.Duration `json:"window"`
	Sent   int64         `json:"sent"`
	// Commit→ack latency of the rows sent in the window (created_at to
	// sent_at), in seconds; 0 when none was sent.
	LatencyP50 float64 `json:"latency_p50_seconds"`
	LatencyP95 float64 `json:"latency_p95_seconds"`
}

// PerSecond is the window's send rate.
func (t Throughput) PerSecond() float64 {
	if t.Window <= 0 {
		return 0
	}
	return float64(t.Sent) / t.Window.Seconds()
}

// ReadThroughput reads the events of the last window the relays passed,
// across replicas (from the lanes' positions, so it needs no relay in this
// process).
func ReadThroughput(ctx context.Context, db DB, window time.Duration) (Throughput, error) {
	t := Throughput{Window: window}
	if err := db.QueryRow(ctx, throughputSQL, Interval(window)).Scan(&t.Sent, &t.LatencyP50, &t.LatencyP95); err != nil {
		return t, fmt.Errorf("outbox throughput: %w", err)
	}
	return t, nil
}
