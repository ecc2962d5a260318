package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// What an attempt produced, over bridge.deliveries, bridge.delivery_attempts,
// bridge.delivery_streams and bridge.subscriptions; and the two ways a claim
// ends without one (reclaim, release).

// Of the statements below, complete and dead move their stream to the back of
// the queue (ready_at = now()) and revive wakes its streams and bumps gen; the
// others leave streams alone, since a stream in flight is never parked (see
// claimSQL).

// reclaimStalledSQL returns deliveries whose lease ran out (their worker died
// or hung) so their streams move again. The attempt is kept: the request may
// have arrived. A delivery that stalled on its last allowed attempt ($2) dies
// instead of being retried forever — a payload that kills its worker every
// time must not loop — but does not count against the endpoint, which never
// answered.
const reclaimStalledSQL = `
WITH r AS (
  UPDATE bridge.deliveries d
  SET status = CASE WHEN d.attempts >= $2 THEN 'dead' ELSE 'pending' END,
      dead_at = CASE WHEN d.attempts >= $2 THEN now() ELSE d.dead_at END,
      next_attempt_at = now(),
      last_error = 'lease expired while in flight (worker ' || coalesce(d.claimed_by, '?') || ' stopped or hung)',
      lease_expires_at = NULL,
      claimed_by = NULL
  WHERE d.id IN (
    SELECT id FROM bridge.deliveries
    WHERE status = 'delivering' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED)
  RETURNING d.status
)
SELECT status FROM r`

// releaseSQL gives one claim back without charging its attempt (shutdown
// before the request went out or finished): a rolling restart must not look
// like a failing endpoint.
const releaseSQL = `
UPDATE bridge.deliveries
SET status = 'pending', attempts = attempts - 1, lease_expires_at = NULL, claimed_by = NULL
WHERE id = $1 AND claimed_by = $2 AND attempts = $3 AND status = 'delivering'`

// releaseAllSQL gives back everything a deliverer still holds at the end of
// its shutdown.
const releaseAllSQL = `
UPDATE bridge.deliveries
SET status = 'pending', attempts = attempts - 1, lease_expires_at = NULL, claimed_by = NULL
WHERE claimed_by = $1 AND status = 'delivering'`

// Outcomes. Each moves the delivery (and its subscription) in one statement;
// the delivery moves only while this worker's claim (claimed_by, attempts) is
// still the current one — after a reclaim, a late answer is logged but
// changes nothing.

// insertAttemptSQL logs one HTTP attempt; it is sent in the same implicit
// transaction (one pgx batch) as the outcome statement below it.
const insertAttemptSQL = `
INSERT INTO bridge.delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code, error, response_body, trace_id)
VALUES ($1, $2, $3, $4, $5, nullif($6, ''), $7, nullif($8, ''))`

// completeSQL: 2xx. A success forgives the subscription's failure count:
// "consecutive" is the whole meaning of that column.
const completeSQL = `
WITH d AS (
  UPDATE bridge.deliveries
  SET status = 'delivered', delivered_at = now(), lease_expires_at = NULL, claimed_by = NULL,
      last_status_code = $4, last_error = NULL
  WHERE id = $1 AND claimed_by = $2 AND attempts = $3 AND status = 'delivering'
  RETURNING subscription_id, coalesce(asset_id, '') AS asset_key
),
s AS (
  UPDATE bridge.subscriptions s SET consecutive_failures = 0, updated_at = now()
  FROM d WHERE s.id = d.subscription_id AND s.consecutive_failures <> 0
),
st AS (
  UPDATE bridge.delivery_streams st SET ready_at = now()
  WHERE (st.subscription_id, st.asset_key) IN (
    SELECT x.subscription_id, x.asset_key FROM bridge.delivery_streams x JOIN d USING (subscription_id, asset_key)
    FOR UPDATE OF x SKIP LOCKED)
)
SELECT count(*) FROM d`

// retrySQL: a failed attempt with retries left. The subscription's failure
// count does not move — only deaths count.
const retrySQL = `
WITH d AS (
  UPDATE bridge.deliveries
  SET status = 'pending', next_attempt_at = now() + $6::interval, lease_expires_at = NULL, claimed_by = NULL,
      last_status_code = $4, last_error = nullif($5, '')
  WHERE id = $1 AND claimed_by = $2 AND attempts = $3 AND status = 'delivering'
  RETURNING id
)
SELECT count(*) FROM d`

// deadSQL: the schedule is exhausted (or the endpoint answered 410 Gone,
// $7). The delivery dies, the rows behind it in its stream proceed, and the
// subscription's consecutive_failures moves by one; at $6
// (WEBHOOK_DISABLE_AFTER) or on 410 the subscription is disabled with the
// reason. The SET expressions read the row's old values; disabled_now says
// this statement is the one that disabled it (disabled_at is now(), the
// transaction's timestamp).
const deadSQL = `
WITH d AS (
  UPDATE bridge.deliveries
  SET status = 'dead', dead_at = now(), lease_expires_at = NULL, claimed_by = NULL,
      last_status_code = $4, last_error = nullif($5, '')
  WHERE id = $1 AND claimed_by = $2 AND attempts = $3 AND status = 'delivering'
  RETURNING subscription_id, coalesce(asset_id, '') AS asset_key
),
st AS (
  UPDATE bridge.delivery_streams st SET ready_at = now()
  WHERE (st.subscription_id, st.asset_key) IN (
    SELECT x.subscription_id, x.asset_key FROM bridge.delivery_streams x JOIN d USING (subscription_id, asset_key)
    FOR UPDATE OF x SKIP LOCKED)
),
s AS (
  UPDATE bridge.subscriptions s
  SET consecutive_failures = s.consecutive_failures + 1,
      enabled = s.enabled AND NOT ($7::boolean OR s.consecutive_failures + 1 >= $6::int),
      disabled_at = CASE WHEN s.enabled AND ($7::boolean OR s.consecutive_failures + 1 >= $6::int)
                         THEN now() ELSE s.disabled_at END,
      disabled_reason = CASE
        WHEN NOT s.enabled THEN s.disabled_reason
        WHEN $7::boolean THEN 'endpoint answered 410 Gone'
        WHEN s.consecutive_failures + 1 >= $6::int
          THEN format('%s consecutive deliveries dead (last: %s)', s.consecutive_failures + 1, $5::text)
        ELSE s.disabled_reason END,
      updated_at = now()
  FROM d WHERE s.id = d.subscription_id
  RETURNING s.enabled, s.consecutive_failures, coalesce(s.disabled_reason, '') AS disabled_reason,
            s.disabled_at IS NOT DISTINCT FROM now() AS disabled_now
)
SELECT (SELECT count(*) FROM d), coalesce((SELECT enabled FROM s), true),
       coalesce((SELECT consecutive_failures FROM s), 0), coalesce((SELECT disabled_reason FROM s), ''),
       coalesce((SELECT disabled_now FROM s), false)`

// ReclaimStalled returns up to limit deliveries whose lease expired to
// pending, keeping their attempt; one whose attempts reached maxAttempts dies.
// It reports how many went back to pending and how many died.
func (s *DeliveryStore) ReclaimStalled(ctx context.Context, limit, maxAttempts int) (pending, dead int, err error) {
	rows, err := s.db.Query(ctx, reclaimStalledSQL, limit, maxAttempts)
	if err != nil {
		return 0, 0, fmt.Errorf("reclaim stalled deliveries: %w", err)
	}
	statuses, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, 0, fmt.Errorf("reclaim stalled deliveries: %w", err)
	}
	for _, st := range statuses {
		if st == StatusDead {
			dead++
		} else {
			pending++
		}
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
