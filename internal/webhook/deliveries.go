package webhook

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Delivery statuses (the contract).
const (
	StatusPending    = "pending"
	StatusDelivering = "delivering"
	StatusDelivered  = "delivered"
	StatusDead       = "dead"
)

// Claim is one delivery handed to this worker: everything the request needs.
type Claim struct {
	ID             int64
	Seq            int64
	SubscriptionID string
	EventID        string
	EventType      string
	Topic          string
	AssetID        *string
	AssetSeq       *int64
	Payload        []byte
	EventCreatedAt time.Time
	Traceparent    string
	Tracestate     string
	// Attempts counts this one (charged at claim). Together with the
	// claimer's id it identifies the claim: an outcome for an older claim of
	// the same row changes nothing.
	Attempts int
	URL      string
	Secrets  []string
	// Revived is true once an operator revived this delivery (dead →
	// pending): its spans say so, still in the original trace.
	Revived bool
}

// Attempt is one HTTP attempt, as logged.
type Attempt struct {
	Attempt      int       `json:"attempt"`
	StartedAt    time.Time `json:"started_at"`
	DurationMS   float64   `json:"duration_ms"`
	StatusCode   *int      `json:"status_code"`
	Error        string    `json:"error,omitempty"`
	ResponseBody string    `json:"response_body,omitempty"`
	TraceID      string    `json:"trace_id,omitempty"`
}

// Delivery is a delivery as the log shows it: never the payload.
type Delivery struct {
	ID             int64      `json:"id"`
	Seq            int64      `json:"seq"`
	SubscriptionID string     `json:"subscription_id"`
	EventID        string     `json:"event_id"`
	EventType      string     `json:"event_type"`
	Topic          string     `json:"topic"`
	AssetID        *string    `json:"asset_id"`
	AssetSeq       *int64     `json:"asset_seq"`
	Status         string     `json:"status"`
	Attempts       int        `json:"attempts"`
	NextAttemptAt  time.Time  `json:"next_attempt_at"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	ClaimedBy      string     `json:"claimed_by,omitempty"`
	LastError      string     `json:"last_error,omitempty"`
	LastStatusCode *int       `json:"last_status_code,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	EventCreatedAt time.Time  `json:"event_created_at"`
	DeliveredAt    *time.Time `json:"delivered_at,omitempty"`
	DeadAt         *time.Time `json:"dead_at,omitempty"`
	RevivedAt      *time.Time `json:"revived_at,omitempty"`
}

// DeliveryStore is the deliveries queue and its log.
type DeliveryStore struct{ db DB }

// NewDeliveryStore returns a store on db.
func NewDeliveryStore(db DB) *DeliveryStore { return &DeliveryStore{db: db} }

// ClaimParams bound one claim.
type ClaimParams struct {
	ClaimedBy   string
	Limit       int
	MaxInFlight int // per subscription
	Lease       time.Duration
}

// Claim hands out up to p.Limit deliveries, at most one per (subscription,
// asset) stream and at most p.MaxInFlight per subscription in flight (see
// claimSQL).
//
// claimSQL alone is race-free as long as a row becomes open only by being
// inserted behind its stream. Revive breaks that: it reopens a dead row in
// the middle of a stream whose later row may be the head right now. A claim
// whose snapshot predates the revive sees that later row as the head and
// claims it, while a claim whose snapshot follows the revive sees the revived
// row as the head and claims it too: two in flight. So each claim holds a
// shared advisory lock, taken in a statement before the claim (so the claim's
// snapshot is taken after it), and revive takes it exclusively: a revive
// waits for the claims running, and the claims after it all see it.
func (s *DeliveryStore) Claim(ctx context.Context, p ClaimParams) ([]Claim, error) {
	var out []Claim
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, claimLockSQL); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, claimSQL, p.ClaimedBy, p.MaxInFlight, p.Limit, p.Lease)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Claim, error) {
			var c Claim
			var payload string
			err := r.Scan(&c.ID, &c.Seq, &c.SubscriptionID, &c.EventID, &c.EventType, &c.Topic, &c.AssetID, &c.AssetSeq,
				&payload, &c.EventCreatedAt, &c.Traceparent, &c.Tracestate, &c.Attempts, &c.URL, &c.Secrets, &c.Revived)
			c.Payload = []byte(payload)
			return c, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return out, nil
}

// ReclaimStalled returns up to limit deliveries whose lease expired to
// pending, keeping their attempt; one whose attempts reached maxAttempts dies.
// It reports how many went back to pending and how many died.
func (s *DeliveryStore) ReclaimStalled(ctx context.Context, limit, maxAttempts int) (pending, dead int, err error) {
	rows, err := s.db.Query(ctx, reclaimStalledSQL, limit, maxAttempts)
	if err != nil {
		return 0, 0, fmt.Errorf("reclaim stalled deliveries: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var status string
		if err := rows.Scan(&id, &status); err != nil {
			return 0, 0, fmt.Errorf("reclaim stalled deliveries: %w", err)
		}
		if status == StatusDead {
			dead++
		} else {
			pending++
		}
	}
	if err := rows.Err(); err != nil {
		return 0, 0, fmt.Errorf("reclaim stalled deliveries: %w", err)
	}
	return pending, dead, nil
}

// Release gives one claim back without charging its attempt.
func (s *DeliveryStore) Release(ctx context.Context, c *Claim, claimedBy string) error {
	if _, err := s.db.Exec(ctx, releaseSQL, c.ID, claimedBy, c.Attempts); err != nil {
		return fmt.Errorf("release delivery %d: %w", c.ID, err)
	}
	return nil
}

// ReleaseAll gives back every claim of claimedBy (end of shutdown).
func (s *DeliveryStore) ReleaseAll(ctx context.Context, claimedBy string) (int, error) {
	tag, err := s.db.Exec(ctx, releaseAllSQL, claimedBy)
	if err != nil {
		return 0, fmt.Errorf("release deliveries: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// PruneDelivered deletes up to limit delivered deliveries older than
// retention, with their attempt log, and reports how many.
func (s *DeliveryStore) PruneDelivered(ctx context.Context, retention time.Duration, limit int) (int, error) {
	tag, err := s.db.Exec(ctx, pruneDeliveredSQL, retention, limit)
	if err != nil {
		return 0, fmt.Errorf("prune delivered deliveries: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Outcome is what one attempt produced.
type Outcome struct {
	StartedAt    time.Time
	Duration     time.Duration
	StatusCode   int // 0: no response
	Error        string
	ResponseBody string // already cut to 1 KiB
	TraceID      string
}

func (s *DeliveryStore) record(ctx context.Context, c *Claim, o Outcome, sql string, args ...any) (pgx.Row, pgx.BatchResults) {
	var status *int
	if o.StatusCode != 0 {
		status = &o.StatusCode
	}
	b := &pgx.Batch{}
	b.Queue(insertAttemptSQL, c.ID, c.Attempts, o.StartedAt, float64(o.Duration)/float64(time.Millisecond),
		status, o.Error, o.ResponseBody, o.TraceID)
	b.Queue(sql, append([]any{c.ID}, args...)...)
	br := s.db.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		return errRow{err}, br
	}
	return br.QueryRow(), br
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

func statusArg(code int) *int {
	if code == 0 {
		return nil
	}
	return &code
}

// Complete records a 2xx: delivered, and the subscription's failure count
// back to 0. It reports whether the claim was still current.
func (s *DeliveryStore) Complete(ctx context.Context, c *Claim, claimedBy string, o Outcome) (bool, error) {
	row, br := s.record(ctx, c, o, completeSQL, claimedBy, c.Attempts, statusArg(o.StatusCode))
	var n int
	err := row.Scan(&n)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("complete delivery %d: %w", c.ID, err)
	}
	return n == 1, nil
}

// Retry records a failed attempt and schedules the next one after delay.
func (s *DeliveryStore) Retry(ctx context.Context, c *Claim, claimedBy string, o Outcome, delay time.Duration) (bool, error) {
	row, br := s.record(ctx, c, o, retrySQL, claimedBy, c.Attempts, statusArg(o.StatusCode), o.Error, delay)
	var n int
	err := row.Scan(&n)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("schedule retry of delivery %d: %w", c.ID, err)
	}
	return n == 1, nil
}

// DeadResult is what a death did to the subscription.
type DeadResult struct {
	Current             bool // the claim was still this worker's
	Enabled             bool
	DisabledNow         bool // this death disabled the subscription
	ConsecutiveFailures int
	DisabledReason      string
}

// Dead records the last failed attempt: the delivery dies, the stream behind
// it proceeds, the subscription's consecutive failures move by one and it is
// disabled at disableAfter (or at once when gone: HTTP 410).
func (s *DeliveryStore) Dead(ctx context.Context, c *Claim, claimedBy string, o Outcome, disableAfter int, gone bool) (DeadResult, error) {
	row, br := s.record(ctx, c, o, deadSQL, claimedBy, c.Attempts, statusArg(o.StatusCode), o.Error, disableAfter, gone)
	var r DeadResult
	var n int
	err := row.Scan(&n, &r.Enabled, &r.ConsecutiveFailures, &r.DisabledReason, &r.DisabledNow)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return DeadResult{}, fmt.Errorf("mark delivery %d dead: %w", c.ID, err)
	}
	r.Current = n == 1
	return r, nil
}

// Revive puts dead deliveries back to pending with attempts reset. Ids that
// are not dead are left alone; the answer lists the revived ones.
func (s *DeliveryStore) Revive(ctx context.Context, ids []int64) ([]int64, error) {
	return s.revive(ctx, reviveSQL, ids)
}

// ReviveSubscription revives every dead delivery of a subscription.
func (s *DeliveryStore) ReviveSubscription(ctx context.Context, subscriptionID string) ([]int64, error) {
	id, err := ParseID(subscriptionID)
	if err != nil {
		return nil, err
	}
	return s.revive(ctx, reviveSubscriptionSQL, id)
}

func (s *DeliveryStore) revive(ctx context.Context, sql string, arg any) ([]int64, error) {
	var out []int64
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		// Exclusive against claims: see Claim.
		if _, err := tx.Exec(ctx, reviveLockSQL); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, sql, arg)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("revive deliveries: %w", err)
	}
	return out, nil
}

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
			return nil, &ValidationError{Field: "after", Value: p.After, Problem: "is not a cursor from a previous page"}
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
	rows, err := s.db.Query(ctx, listDeliveriesSQL, sub, status, asset, p.Limit+1, after, eventType, from, to)
	if err != nil {
		return nil, fmt.Errorf("list deliveries: %w", err)
	}
	ds, err := pgx.CollectRows(rows, scanDelivery)
	if err != nil {
		return nil, fmt.Errorf("list deliveries: %w", err)
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
	d, err := pgx.CollectExactlyOneRow(rows, scanDelivery)
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

// Attempts returns a delivery's attempt log, oldest first.
func (s *DeliveryStore) Attempts(ctx context.Context, id int64) ([]Attempt, error) {
	var exists bool
	if err := s.db.QueryRow(ctx, deliveryExistsSQL, id).Scan(&exists); err != nil {
		return nil, fmt.Errorf("read delivery %d: %w", id, err)
	}
	if !exists {
		return nil, notFound("delivery", strconv.FormatInt(id, 10), pgx.ErrNoRows)
	}
	rows, err := s.db.Query(ctx, listAttemptsSQL, id)
	if err != nil {
		return nil, fmt.Errorf("list attempts of delivery %d: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
		var a Attempt
		err := r.Scan(&a.Attempt, &a.StartedAt, &a.DurationMS, &a.StatusCode, &a.Error, &a.ResponseBody, &a.TraceID)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("list attempts of delivery %d: %w", id, err)
	}
	return out, nil
}

func scanDelivery(r pgx.CollectableRow) (Delivery, error) {
	var d Delivery
	err := r.Scan(&d.ID, &d.Seq, &d.SubscriptionID, &d.EventID, &d.EventType, &d.Topic, &d.AssetID, &d.AssetSeq,
		&d.Status, &d.Attempts, &d.NextAttemptAt, &d.LeaseExpiresAt, &d.ClaimedBy, &d.LastError,
		&d.LastStatusCode, &d.CreatedAt, &d.EventCreatedAt, &d.DeliveredAt, &d.DeadAt, &d.RevivedAt)
	return d, err
}

// truncateUTF8 cuts s to at most n bytes on a rune boundary and makes it
// storable as PostgreSQL text (valid UTF-8, no NUL).
func truncateUTF8(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	// A cut inside a multi-byte rune leaves a replacement char at the end,
	// which is honest about the cut.
	return s
}
