package outboxstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxbridge/bridge/internal/database/statement"
)

// The console's views of NEW and SENT rows (internal/console), beside the
// FAILED view of inspect.go, over bridge.outbox: NEW rows in seq order, SENT
// rows newest first by seq (the log records no send time for rows sent with
// their batch, so sent_at cannot order them).

// viewWhere narrows a view: $1 topic, $2 asset, $3 event type ("" matches
// everything).
const viewWhere = `
  AND ($1 = '' OR topic = $1)
  AND ($2 = '' OR coalesce(asset_id, '') = $2)
  AND ($3 = '' OR event_type = $3)`

const viewColumns = `id, seq, asset_seq, topic, asset_id, event_type, attempts, coalesce(last_error, '') AS last_error,
       created_at, failed_at, NULL::text AS payload, status, next_attempt_at, sent_at`

// listNewSQL pages NEW rows oldest first after seq $5.
const listNewSQL = `
SELECT ` + viewColumns + `
FROM bridge.outbox
WHERE status = 'NEW'` + viewWhere + `
  AND seq > $5
ORDER BY seq
LIMIT $4`

// listSentSQL pages SENT rows newest first, after the cursor ($6 seq; $5
// set: a cursor was given) of the previous page's last row.
const listSentSQL = `
SELECT ` + viewColumns + `
FROM bridge.outbox
WHERE status = 'SENT'` + viewWhere + `
  AND ($5::timestamptz IS NULL OR seq < $6)
ORDER BY seq DESC
LIMIT $4`

// countViewSQL counts a view's rows up to $5 (a view of SENT rows may hold
// millions until RELAY_RETENTION deletes them; the console says "10,000+").
const countViewSQL = `
SELECT count(*) FROM (
  SELECT 1 FROM bridge.outbox WHERE status = $4` + viewWhere + `
  LIMIT $5
) v`

// ErrBadCursor: a view's cursor is not one a previous page gave.
var ErrBadCursor = errors.New("not a cursor from a previous page")

// ViewFilter narrows the NEW or SENT view. Zero fields match everything.
type ViewFilter struct {
	Topic     string
	AssetID   string
	EventType string
}

// ViewRow is one row of a view (no payload).
type ViewRow struct {
	FailedRow
	Status        string     `json:"status" db:"status"`
	NextAttemptAt time.Time  `json:"next_attempt_at" db:"next_attempt_at"`
	SentAt        *time.Time `json:"sent_at,omitempty" db:"sent_at"`
}

// ViewPage is one page of a view; Next is the cursor of the next page ("":
// the last page).
type ViewPage struct {
	Rows []ViewRow
	Next string
}

// ListView pages the rows of one status: NEW oldest first (by seq), SENT
// newest first (by sent_at). cursor is a previous page's Next ("" for the
// first page). FAILED rows have their own filter (ListFailedMatching).
func ListView(ctx context.Context, db DB, status string, f ViewFilter, limit int, cursor string) (ViewPage, error) {
	var rows []ViewRow
	var err error
	switch status {
	case "NEW":
		var after int64
		if cursor != "" {
			if after, err = strconv.ParseInt(cursor, 10, 64); err != nil || after < 0 {
				return ViewPage{}, fmt.Errorf("cursor %q of NEW rows: %w", cursor, ErrBadCursor)
			}
		}
		rows, err = statement.Select[ViewRow](ctx, db, "list NEW outbox rows", listNewSQL, f.Topic, f.AssetID, f.EventType, limit+1, after)
	case "SENT":
		var at *time.Time
		var seq int64
		if cursor != "" {
			ts, s, ok := strings.Cut(cursor, "_")
			ns, e1 := strconv.ParseInt(ts, 10, 64)
			n, e2 := strconv.ParseInt(s, 10, 64)
			if !ok || e1 != nil || e2 != nil {
				return ViewPage{}, fmt.Errorf("cursor %q of SENT rows: %w", cursor, ErrBadCursor)
			}
			t := time.Unix(0, ns).UTC()
			at, seq = &t, n
		}
		rows, err = statement.Select[ViewRow](ctx, db, "list SENT outbox rows", listSentSQL, f.Topic, f.AssetID, f.EventType, limit+1, at, seq)
	default:
		return ViewPage{}, fmt.Errorf("status %q: the views are NEW and SENT", status)
	}
	if err != nil {
		return ViewPage{}, err
	}
	p := ViewPage{Rows: rows}
	if len(rows) > limit {
		p.Rows = rows[:limit]
		last := p.Rows[limit-1]
		if status == "NEW" {
			p.Next = strconv.FormatInt(last.Seq, 10)
		} else {
			// "<sent_at in ns, 0 when not recorded>_<seq>"; pages go by seq.
			var ns int64
			if last.SentAt != nil {
				ns = last.SentAt.UTC().Truncate(time.Microsecond).UnixNano()
			}
			p.Next = strconv.FormatInt(ns, 10) + "_" + strconv.FormatInt(last.Seq, 10)
		}
	}
	return p, nil
}

// CountView counts the rows of one status matching f, up to limit.
func CountView(ctx context.Context, db DB, status string, f ViewFilter, limit int64) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, countViewSQL, f.Topic, f.AssetID, f.EventType, status, limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("count %s outbox rows: %w", status, err)
	}
	return n, nil
}

// Exists reports whether there is an outbox row with this id (the console's
// search by id).
func Exists(ctx context.Context, db DB, id uuid.UUID) (bool, error) {
	var ok bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM bridge.outbox WHERE id = $1)`, id).Scan(&ok); err != nil {
		return false, fmt.Errorf("find outbox row %s: %w", id, err)
	}
	return ok, nil
}
