package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/database/statement"
)

// deliveryColumns is the column list of a Delivery as the log shows it,
// named as its db tags. No payload.
const deliveryColumns = `d.id, d.seq, d.subscription_id::text AS subscription_id, d.event_id, d.event_type, d.topic,
       d.asset_id, d.asset_seq, d.status, d.attempts, d.next_attempt_at, d.lease_expires_at,
       coalesce(d.claimed_by, '') AS claimed_by, coalesce(d.last_error, '') AS last_error, d.last_status_code,
       d.created_at, d.event_created_at, d.delivered_at, d.dead_at, d.revived_at`

// The log. These queries deliberately leave out payload: the log is
// the most-run query and must never be a way to read a tenant's history.

// listDeliveriesSQL pages newest first by id ($5: the last id of the previous
// page, NULL for the first); $6 event type, $7/$8 a created_at range (NULL:
// any).
const listDeliveriesSQL = `
SELECT ` + deliveryColumns + `
FROM bridge.deliveries d
WHERE ($1::uuid IS NULL OR d.subscription_id = $1)
  AND ($2::text IS NULL OR d.status = $2)
  AND ($3::text IS NULL OR d.asset_id IS NOT DISTINCT FROM nullif($3, ''))
  AND ($5::bigint IS NULL OR d.id < $5)
  AND ($6::text IS NULL OR d.event_type = $6)
  AND ($7::timestamptz IS NULL OR d.created_at >= $7)
  AND ($8::timestamptz IS NULL OR d.created_at < $8)
ORDER BY d.id DESC
LIMIT $4`

const getDeliverySQL = `SELECT ` + deliveryColumns + ` FROM bridge.deliveries d WHERE d.id = $1`

// getPayloadSQL is the one deliberate way to read a payload
// (`bridge deliveries show ID --payload`).
const getPayloadSQL = `SELECT payload::text FROM bridge.deliveries WHERE id = $1`

// ListParams filter and page the delivery log.
type ListParams struct {
	SubscriptionID string // "" any
	Status         string // "" any
	AssetID        *string
	EventType      string // "" any
	// CreatedFrom / CreatedTo bound created_at (inclusive / exclusive);
	// zero: unbounded.
	CreatedFrom, CreatedTo time.Time
	Limit                  int
	After                  string // cursor from the previous page
}

// Page is one page of the log; NextCursor is "" on the last page.
type Page struct {
	Deliveries []Delivery `json:"deliveries"`
	NextCursor string     `json:"next_cursor,omitempty"`
}

// List pages the delivery log newest first. It never reads payloads.
func (s *DeliveryStore) List(ctx context.Context, p ListParams) (*Page, error) {
	var sub, status, after any
	if p.SubscriptionID != "" {
		id, err := ParseID(p.SubscriptionID)
		if err != nil {
			return nil, err
		}
		sub = id
	}
	if p.Status != "" {
		switch p.Status {
		case StatusPending, StatusDelivering, StatusDelivered, StatusDead:
		default:
			return nil, &ValidationError{Field: "status", Value: p.Status, Problem: "must be pending, delivering, delivered or dead"}
		}
		status = p.Status
	}
	if p.After != "" {
		n, err := strconv.ParseInt(p.After, 10, 64)
		if err != nil || n <= 0 {
			return nil, &ValidationError{Field: "cursor", Value: p.After, Problem: "is not a cursor from a previous page"}
		}
		after = n
	}
	if p.Limit <= 0 || p.Limit > 1000 {
		return nil, &ValidationError{Field: "limit", Value: strconv.Itoa(p.Limit), Problem: "must be between 1 and 1000"}
	}
	var asset any
	if p.AssetID != nil {
		asset = *p.AssetID
	}
	var eventType, from, to any
	if p.EventType != "" {
		eventType = p.EventType
	}
	if !p.CreatedFrom.IsZero() {
		from = p.CreatedFrom
	}
	if !p.CreatedTo.IsZero() {
		to = p.CreatedTo
	}
	ds, err := statement.Select[Delivery](ctx, s.db, "list deliveries", listDeliveriesSQL, sub, status, asset, p.Limit+1, after, eventType, from, to)
	if err != nil {
		return nil, err
	}
	page := &Page{Deliveries: ds}
	if len(ds) > p.Limit {
		page.Deliveries = ds[:p.Limit]
		page.NextCursor = strconv.FormatInt(ds[p.Limit-1].ID, 10)
	}
	return page, nil
}

// Get returns one delivery (no payload).
func (s *DeliveryStore) Get(ctx context.Context, id int64) (*Delivery, error) {
	rows, err := s.db.Query(ctx, getDeliverySQL, id)
	if err != nil {
		return nil, fmt.Errorf("read delivery %d: %w", id, err)
	}
	d, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[Delivery])
	if err != nil {
		return nil, notFound("delivery", strconv.FormatInt(id, 10), err)
	}
	return &d, nil
}

// Payload returns a delivery's payload: the one deliberate way to read it.
func (s *DeliveryStore) Payload(ctx context.Context, id int64) ([]byte, error) {
	var p string
	if err := s.db.QueryRow(ctx, getPayloadSQL, id).Scan(&p); err != nil {
		return nil, notFound("delivery", strconv.FormatInt(id, 10), err)
	}
	return []byte(p), nil
}

// Delivery is a delivery as the log shows it: never the payload.
type Delivery struct {
	ID             int64      `json:"id" db:"id"`
	Seq            int64      `json:"seq" db:"seq"`
	SubscriptionID string     `json:"subscription_id" db:"subscription_id"`
	EventID        string     `json:"event_id" db:"event_id"`
	EventType      string     `json:"event_type" db:"event_type"`
	Topic          string     `json:"topic" db:"topic"`
	AssetID        *string    `json:"asset_id" db:"asset_id"`
	AssetSeq       *int64     `json:"asset_seq" db:"asset_seq"`
	Status         string     `json:"status" db:"status"`
	Attempts       int        `json:"attempts" db:"attempts"`
	NextAttemptAt  time.Time  `json:"next_attempt_at" db:"next_attempt_at"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty" db:"lease_expires_at"`
	ClaimedBy      string     `json:"claimed_by,omitempty" db:"claimed_by"`
	LastError      string     `json:"last_error,omitempty" db:"last_error"`
	LastStatusCode *int       `json:"last_status_code,omitempty" db:"last_status_code"`
	CreatedAt      time.Time  `json:"created_at" db:"created_at"`
	EventCreatedAt time.Time  `json:"event_created_at" db:"event_created_at"`
	DeliveredAt    *time.Time `json:"delivered_at,omitempty" db:"delivered_at"`
	DeadAt         *time.Time `json:"dead_at,omitempty" db:"dead_at"`
	RevivedAt      *time.Time `json:"revived_at,omitempty" db:"revived_at"`
}

// Attempt is one HTTP attempt, as logged.
type Attempt struct {
	// Lane is the lane that made it: "fast" (bridge.webhook_attempts) or
	// "slow" (bridge.delivery_attempts).
	Lane         string    `json:"lane" db:"lane"`
	Attempt      int       `json:"attempt" db:"attempt"`
	StartedAt    time.Time `json:"started_at" db:"started_at"`
	DurationMS   float64   `json:"duration_ms" db:"duration_ms"`
	StatusCode   *int      `json:"status_code" db:"status_code"`
	Error        string    `json:"error,omitempty" db:"error"`
	ResponseBody string    `json:"response_body,omitempty" db:"response_body"`
	TraceID      string    `json:"trace_id,omitempty" db:"trace_id"`
}
