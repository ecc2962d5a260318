package outboxstore

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/database/statement"
)

// The operator's view of the table: `bridge outbox stats|failed|replay`, the
// admin API and the outbox gauges.

const statsByStatusSQL = `SELECT status, count(*) FROM bridge.outbox GROUP BY status`

const oldestNewSQL = `
SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM bridge.outbox WHERE status = 'NEW'`

const failedByTopicSQL = `
SELECT topic, count(*) FROM bridge.outbox_held WHERE status = 'FAILED' GROUP BY topic ORDER BY topic`

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
func ReadStats(ctx context.Context, db DB) (Stats, error) {
	st := Stats{ByStatus: map[string]int64{"NEW": 0, "SENT": 0, "FAILED": 0}, FailedByTopic: map[string]int64{}}
	if err := scanCounts(ctx, db, statsByStatusSQL, st.ByStatus); err != nil {
		return st, fmt.Errorf("outbox stats: %w", err)
	}
	if err := db.QueryRow(ctx, oldestNewSQL).Scan(&st.OldestNewAgeSeconds); err != nil {
		return st, fmt.Errorf("outbox stats: %w", err)
	}
	if err := scanCounts(ctx, db, failedByTopicSQL, st.FailedByTopic); err != nil {
		return st, fmt.Errorf("outbox stats: %w", err)
	}
	return st, nil
}

// gaugeBoundSQL is the lowest xmax of the lanes' positions (their tick
// snapshots): every row of a transaction below it that no tick saw in
// progress was passed by its lane. A lane without a position bounds
// nothing ('0': its rows are all NEW). (The xmin does not bound it: one
// long transaction anywhere on the server holds every snapshot's xmin
// back.)
const gaugeBoundSQL = `
SELECT CASE WHEN count(p.tick) = count(*) THEN min(pg_snapshot_xmax(p.tick)) ELSE '0'::text::xid8 END
FROM bridge.relay_lanes rl LEFT JOIN bridge.relay_positions p ON p.lane = rl.lane`

// gaugeNewSQL counts the NEW rows and the oldest one's age without reading
// the passed part of the log: only the rows at or above the bound ($1,
// gaugeBoundSQL), and those of a transaction some lane's tick saw in
// progress, can be NEW — two reads of the (xid, seq) index, however long
// the log. The bound is a parameter, not a subquery, so that the planner
// sees its value and reads the index from it (with a subquery it assumes
// a third of the log and may scan it all). A held row takes its status
// from bridge.outbox_held.
const gaugeNewSQL = `
WITH candidates AS (
  SELECT l.id, l.lane, l.xid, l.seq, l.created_at FROM bridge.outbox_log l
  WHERE l.xid >= $1::xid8
  UNION ALL
  SELECT l.* FROM (SELECT DISTINCT pg_snapshot_xip(tick) AS x FROM bridge.relay_positions) xs
  CROSS JOIN LATERAL (
    -- OFFSET 0 keeps this a lookup of each transaction in the index: the
    -- planner would otherwise join the few in-progress transactions
    -- against every row below the bound.
    SELECT l.id, l.lane, l.xid, l.seq, l.created_at FROM bridge.outbox_log l
    WHERE l.xid = xs.x AND l.xid < $1::xid8 OFFSET 0) l
), new_rows AS (
  SELECT c.created_at, 1 AS in_log FROM candidates c LEFT JOIN bridge.relay_positions p ON p.lane = c.lane
  WHERE NOT bridge.outbox_passed(c.xid, c.seq, p)
    AND NOT EXISTS (SELECT 1 FROM bridge.outbox_held h WHERE h.id = c.id)
  UNION ALL
  SELECT created_at, 0 FROM bridge.outbox_held WHERE status = 'NEW'
)
SELECT count(*), coalesce(sum(in_log), 0), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM new_rows`

// gaugeHeldSQL counts the held rows by status, and those of them whose
// event is still in the log (the log's row then takes the held status).
const gaugeHeldSQL = `
SELECT h.status, count(*),
       count(*) FILTER (WHERE EXISTS (SELECT 1 FROM bridge.outbox_log l
                                      WHERE l.id = h.id AND l.tbl = get_byte(uuid_send(h.id), 15) & 3))
FROM bridge.outbox_held h GROUP BY h.status`

// gaugeLogRowsSQL is PostgreSQL's own count of the log's live rows
// (pg_stat_user_tables, kept as rows are inserted and tables truncated):
// an estimate, a second or so behind, that costs no scan.
const gaugeLogRowsSQL = `
SELECT coalesce(sum(n_live_tup), 0)::bigint FROM pg_stat_user_tables
WHERE schemaname = 'bridge' AND relname IN ('outbox_log_0', 'outbox_log_1', 'outbox_log_2', 'outbox_log_3')`

// ReadGaugeStats is ReadStats for the metrics, read on every refresh: NEW,
// FAILED and the oldest NEW row's age are exact, and SENT is estimated
// from the log's live row count. Counting SENT exactly (ReadStats) reads
// every row the log keeps for RELAY_RETENTION — tens of millions at a few
// hundred events a second — and a refresh every minute would put that
// full read on the application's database each time.
func ReadGaugeStats(ctx context.Context, db DB) (Stats, error) {
	st := Stats{ByStatus: map[string]int64{"NEW": 0, "SENT": 0, "FAILED": 0}, FailedByTopic: map[string]int64{}}
	var bound string
	var newAll, newInLog, logRows int64
	if err := db.QueryRow(ctx, gaugeBoundSQL).Scan(&bound); err != nil {
		return st, fmt.Errorf("outbox gauges: %w", err)
	}
	if err := db.QueryRow(ctx, gaugeNewSQL, bound).Scan(&newAll, &newInLog, &st.OldestNewAgeSeconds); err != nil {
		return st, fmt.Errorf("outbox gauges: %w", err)
	}
	if err := db.QueryRow(ctx, gaugeLogRowsSQL).Scan(&logRows); err != nil {
		return st, fmt.Errorf("outbox gauges: %w", err)
	}
	rows, err := db.Query(ctx, gaugeHeldSQL)
	if err != nil {
		return st, fmt.Errorf("outbox gauges: %w", err)
	}
	var status string
	var held, heldInLog, allHeldInLog int64
	if _, err := pgx.ForEachRow(rows, []any{&status, &held, &heldInLog}, func() error {
		allHeldInLog += heldInLog
		if status != "NEW" {
			st.ByStatus[status] += held
		}
		return nil
	}); err != nil {
		return st, fmt.Errorf("outbox gauges: %w", err)
	}
	st.ByStatus["NEW"] = newAll
	st.ByStatus["SENT"] += max(0, logRows-newInLog-allHeldInLog)
	if err := scanCounts(ctx, db, failedByTopicSQL, st.FailedByTopic); err != nil {
		return st, fmt.Errorf("outbox gauges: %w", err)
	}
	return st, nil
}

func scanCounts(ctx context.Context, db DB, sql string, into map[string]int64) error {
	rows, err := db.Query(ctx, sql)
	if err != nil {
		return err
	}
	var k string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&k, &n}, func() error { into[k] = n; return nil })
	return err
}

// listFailedSQL pages FAILED rows in seq order after seq $4 (0: from the
// start; a keyset cursor stays stable while rows are replayed or parked
// between two pages). The payload is read only when asked for ($3).
const listFailedSQL = `
SELECT id, seq, asset_seq, topic, asset_id, event_type, attempts, coalesce(last_error, '') AS last_error,
       created_at, failed_at, CASE WHEN $3 THEN payload::text END AS payload
FROM bridge.outbox_held
WHERE status = 'FAILED' AND ($1 = '' OR topic = $1) AND seq > $4
ORDER BY seq
LIMIT $2`

// FailedRow is a parked row as operators see it. Payload is empty unless
// asked for: the listing is for triage, not for reading event contents.
type FailedRow struct {
	ID        uuid.UUID  `json:"id" db:"id"`
	Seq       int64      `json:"seq" db:"seq"`
	AssetSeq  int64      `json:"asset_seq" db:"asset_seq"`
	Topic     string     `json:"topic" db:"topic"`
	AssetID   *string    `json:"asset_id" db:"asset_id"`
	EventType string     `json:"event_type" db:"event_type"`
	Attempts  int        `json:"attempts" db:"attempts"`
	LastError string     `json:"last_error" db:"last_error"`
	CreatedAt time.Time  `json:"created_at" db:"created_at"`
	FailedAt  *time.Time `json:"failed_at" db:"failed_at"`
	Payload   *string    `json:"payload,omitempty" db:"payload"`
}

// ListFailed returns up to limit FAILED rows with seq above afterSeq, in seq
// order (topic "" = all; afterSeq 0 = from the start).
func ListFailed(ctx context.Context, db DB, topic string, limit int, withPayload bool, afterSeq int64) ([]FailedRow, error) {
	return statement.Select[FailedRow](ctx, db, "list failed outbox rows", listFailedSQL, topic, limit, withPayload, afterSeq)
}

// replayByIDSQL returns FAILED rows to NEW with a fresh budget. The row keeps
// its seq, so it goes out before any later row of its asset that is still NEW.
// Each requested id comes back once: replayed, or the status it has (NULL:
// no such row). The outer read of bridge.outbox sees the statement's
// snapshot, before the update.
//
// Every replay wakes the relays from the lowest seq it replayed
// (bridge.wake_relays, migration 00090): the relay's claim starts at the
// lowest seq it knows to be NEW, and a replayed row, keeping its old seq, is
// below that; without the wake-up it would stay NEW forever.
const replayByIDSQL = `
WITH req AS (SELECT DISTINCT unnest($1::uuid[]) AS id),
r AS (
  UPDATE bridge.outbox_held o
  SET status = 'NEW', attempts = 0, next_attempt_at = now(), failed_at = NULL, replayed_at = now()
  WHERE o.status = 'FAILED' AND o.id = ANY($1::uuid[])
  RETURNING o.id, o.seq
),
wake AS (SELECT bridge.wake_relays(min(seq)) FROM r)
SELECT req.id, r.id IS NOT NULL, o.status
FROM req LEFT JOIN r ON r.id = req.id LEFT JOIN bridge.outbox o ON o.id = req.id CROSS JOIN wake
ORDER BY req.id`

// replayAllSQL: see replayByIDSQL for the wake-up.
const replayAllSQL = `
WITH r AS (
  UPDATE bridge.outbox_held
  SET status = 'NEW', attempts = 0, next_attempt_at = now(), failed_at = NULL, replayed_at = now()
  WHERE status = 'FAILED' AND ($1 = '' OR topic = $1)
    AND ($2::interval IS NULL OR failed_at >= now() - $2::interval)
  RETURNING seq
)
SELECT count(*), bridge.wake_relays(min(seq)) FROM r`

// NotReplayed is an id ReplayIDs left alone, and why ("no such outbox
// row", "is SENT, not FAILED").
type NotReplayed = statement.LeftAlone[uuid.UUID]

// ReplayIDs returns the given FAILED rows to NEW with attempts reset. They
// keep their seq and their trace: the replayed send continues the original
// trace. Every other id is reported with the reason it was left alone (it
// does not exist, or is not FAILED), so an id mistyped or already replayed
// does not vanish into "replayed 0 row(s)".
func ReplayIDs(ctx context.Context, db DB, ids []uuid.UUID) (replayed []uuid.UUID, notReplayed []NotReplayed, err error) {
	rows, err := db.Query(ctx, replayByIDSQL, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("replay outbox rows: %w", err)
	}
	defer rows.Close()
	var a statement.Acted[uuid.UUID]
	for rows.Next() {
		if err := a.Scan(rows, "outbox row", "FAILED"); err != nil {
			return nil, nil, fmt.Errorf("replay outbox rows: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("replay outbox rows: %w", err)
	}
	return a.Done, a.Left, nil
}

// ReplayAllFailed returns every FAILED row (of topic, if not "", and failed
// within since, if > 0) to NEW.
func ReplayAllFailed(ctx context.Context, db DB, topic string, since time.Duration) (int64, error) {
	var sinceArg *string
	if since > 0 {
		s := Interval(since)
		sinceArg = &s
	}
	var n int64
	var woke *int64
	if err := db.QueryRow(ctx, replayAllSQL, topic, sinceArg).Scan(&n, &woke); err != nil {
		return 0, fmt.Errorf("replay outbox rows: %w", err)
	}
	return n, nil
}
