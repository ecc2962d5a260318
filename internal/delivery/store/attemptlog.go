package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxbridge/bridge/internal/database/statement"
)

// The attempt log, whichever lane made the attempt. The slow lane logs into
// bridge.delivery_attempts (keyed by delivery id), the fast lane into
// bridge.webhook_attempts (no delivery row). What identifies one delivery in
// both is (subscription id, event id): the event id is the webhook-id, and
// bridge.deliveries holds at most one row per pair. A delivery the fast lane
// tried and then parked has its first attempt in the fast lane's log and
// the rest in the slow lane's; reading by the pair shows all of them.

// Lanes an attempt can come from (Attempt.Lane).
const (
	LaneFast = "fast"
	LaneSlow = "slow"
)

// attemptKeySQL turns a delivery id into the key of its attempt log.
const attemptKeySQL = `SELECT subscription_id::text, event_id FROM bridge.deliveries WHERE id = $1`

// attemptLogSQL is the one query over both attempt logs: oldest first, a
// keyset on (started_at, lane_rank, attempt, k2, k3) ($3..$7; $3 NULL for
// the first page). k2/k3 break ties within a lane: the Kafka partition and
// offset of a fast-lane attempt, the row id of a slow-lane one. It walks
// deliveries_once_per_subscription + delivery_attempts_by_delivery and
// webhook_attempts_by_event. Never the payload.
const attemptLogSQL = `
SELECT a.lane, a.attempt, a.started_at, a.duration_ms, a.status_code, a.error, a.response_body, a.trace_id,
       a.lane_rank, a.k2, a.k3
FROM (
  SELECT 'slow' AS lane, 1 AS lane_rank, x.attempt, x.started_at, x.duration_ms, x.status_code,
         coalesce(x.error, '') AS error, coalesce(x.response_body, '') AS response_body,
         coalesce(x.trace_id, '') AS trace_id, 0::bigint AS k2, x.id AS k3
  FROM bridge.deliveries d JOIN bridge.delivery_attempts x ON x.delivery_id = d.id
  WHERE d.subscription_id = $1 AND d.event_id = $2
  UNION ALL
  SELECT 'fast', 0, w.attempt, w.started_at, w.duration_ms, w.status_code,
         coalesce(w.error, ''), coalesce(w.response_body, ''), coalesce(w.trace_id, ''),
         w.kafka_partition::bigint, w.kafka_offset
  FROM bridge.webhook_attempts w
  WHERE w.subscription_id = $1 AND w.event_id = $2
) a
WHERE $3::timestamptz IS NULL
   OR (a.started_at, a.lane_rank, a.attempt, a.k2, a.k3) > ($3::timestamptz, $4::int, $5::int, $6::bigint, $7::bigint)
ORDER BY a.started_at, a.lane_rank, a.attempt, a.k2, a.k3
LIMIT $8`

// AttemptLogParams select one delivery's attempt log: by DeliveryID (a
// slow-lane row), or by SubscriptionID + EventID (either lane; the only key
// of a delivery the fast lane made alone).
type AttemptLogParams struct {
	DeliveryID     int64
	SubscriptionID string
	EventID        string
	Limit          int
	After          string // cursor from the previous page
}

// AttemptPage is one page of an attempt log; NextCursor is "" on the last.
type AttemptPage struct {
	Attempts   []Attempt `json:"attempts"`
	NextCursor string    `json:"next_cursor,omitempty"`
}

type attemptRow struct {
	Attempt
	LaneRank int   `db:"lane_rank"`
	K2       int64 `db:"k2"`
	K3       int64 `db:"k3"`
}

func (r attemptRow) cursor() string {
	return fmt.Sprintf("%d.%d.%d.%d.%d", r.StartedAt.UnixMicro(), r.LaneRank, r.Attempt.Attempt, r.K2, r.K3)
}

func parseAttemptCursor(s string) ([]any, error) {
	parts := strings.Split(s, ".")
	if len(parts) != 5 {
		return nil, &ValidationError{Field: "cursor", Value: s, Problem: "is not a cursor from a previous page"}
	}
	n := make([]int64, 5)
	for i, p := range parts {
		v, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, &ValidationError{Field: "cursor", Value: s, Problem: "is not a cursor from a previous page"}
		}
		n[i] = v
	}
	return []any{time.UnixMicro(n[0]).UTC(), n[1], n[2], n[3], n[4]}, nil
}

// AttemptLog pages one delivery's attempts over both lanes, oldest first.
// By DeliveryID it is store.ErrNotFound when there is no such delivery; by
// (SubscriptionID, EventID) an unknown pair is an empty log (the fast lane's
// log keeps no delivery to look up, and retention drops it whole).
func (s *DeliveryStore) AttemptLog(ctx context.Context, p AttemptLogParams) (*AttemptPage, error) {
	if p.Limit <= 0 || p.Limit > 1000 {
		return nil, &ValidationError{Field: "limit", Value: strconv.Itoa(p.Limit), Problem: "must be between 1 and 1000"}
	}
	sub, event := p.SubscriptionID, p.EventID
	switch {
	case p.DeliveryID != 0 && (sub != "" || event != ""):
		return nil, &ValidationError{Field: "delivery id", Value: strconv.FormatInt(p.DeliveryID, 10), Problem: "selects an attempt log alone, not with a subscription and event id"}
	case p.DeliveryID != 0:
		if err := s.db.QueryRow(ctx, attemptKeySQL, p.DeliveryID).Scan(&sub, &event); err != nil {
			return nil, notFound("delivery", strconv.FormatInt(p.DeliveryID, 10), err)
		}
	case sub == "" || event == "":
		return nil, &ValidationError{Field: "event id", Value: event, Problem: "an attempt log is selected by a delivery id or by a subscription id and an event id"}
	default:
		id, err := ParseID(sub)
		if err != nil {
			return nil, err
		}
		sub = id
	}
	after := []any{nil, nil, nil, nil, nil}
	if p.After != "" {
		a, err := parseAttemptCursor(p.After)
		if err != nil {
			return nil, err
		}
		after = a
	}
	args := append([]any{sub, event}, after...)
	args = append(args, p.Limit+1)
	rows, err := statement.Select[attemptRow](ctx, s.db, fmt.Sprintf("list attempts of subscription %s event %q", sub, event), attemptLogSQL, args...)
	if err != nil {
		return nil, err
	}
	page := &AttemptPage{Attempts: make([]Attempt, 0, min(len(rows), p.Limit))}
	for i, r := range rows {
		if i == p.Limit {
			page.NextCursor = rows[i-1].cursor()
			break
		}
		page.Attempts = append(page.Attempts, r.Attempt)
	}
	return page, nil
}

// Attempts returns a delivery's whole attempt log over both lanes, oldest
// first: AttemptLog's pages, followed to the end.
func (s *DeliveryStore) Attempts(ctx context.Context, id int64) ([]Attempt, error) {
	var all []Attempt
	p := AttemptLogParams{DeliveryID: id, Limit: 1000}
	for {
		page, err := s.AttemptLog(ctx, p)
		if err != nil {
			return nil, err
		}
		all = append(all, page.Attempts...)
		if page.NextCursor == "" {
			return all, nil
		}
		p.After = page.NextCursor
	}
}
