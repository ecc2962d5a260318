package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/contract"
)

// What an attempt produced, over bridge.deliveries, bridge.delivery_attempts,
// bridge.delivery_streams and bridge.subscriptions; and the two ways a claim
// ends without one (reclaim, release).

// Of the statements below, complete and dead move their stream to the back of
// the queue (ready_at = now()) — complete parks it instead when the row was
// its last open one — and revive wakes its streams and bumps gen; the
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
  RETURNING d.status, d.id, d.subscription_id::text AS subscription_id, d.event_id, d.event_type, d.topic,
            d.asset_id, d.asset_seq, d.attempts
)
SELECT status, id, subscription_id, event_id, event_type, topic, asset_id, asset_seq, attempts FROM r`

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

// Outcomes. The delivery moves only while this worker's claim (claimed_by,
// attempts) is still the current one — after a reclaim, a late answer is
// logged but changes nothing.
//
// Successes and retries are written in batches (Record): one transaction
// logs every attempt of the batch and moves every delivery, instead of a
// transaction (and a WAL flush) per delivery, which capped the engine near
// 1,760 deliveries/s. A batch not yet written changes nothing about the
// crash semantics: its deliveries are still 'delivering' under their lease,
// so a deliverer that dies with outcomes in memory leaves claims that
// reclaim_stalled returns with their attempt kept, exactly as if it had died
// mid-request. Deaths are written one at a time (deadSQL), since each one
// counts toward its subscription's disable threshold in order.

// insertAttemptsSQL logs HTTP attempts, one row per array element; it runs
// in the same transaction as the outcome statements.
const insertAttemptsSQL = `
INSERT INTO bridge.delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code, error, response_body, trace_id)
SELECT a.delivery_id, a.attempt, a.started_at, a.duration_ms, a.status_code, nullif(a.error, ''), a.response_body, nullif(a.trace_id, '')
FROM unnest($1::bigint[], $2::int[], $3::timestamptz[], $4::float8[], $5::int[], $6::text[], $7::text[], $8::text[])
  AS a(delivery_id, attempt, started_at, duration_ms, status_code, error, response_body, trace_id)`

// completeSQL: 2xx, for a batch of claims of one claimer ($1; $2 ids, $3
// their attempts, $4 status codes). A success forgives the subscription's
// failure count: "consecutive" is the whole meaning of that column. The
// subscription rows are locked in id order, so two batches (two replicas)
// that forgive the same subscriptions cannot deadlock on them.
//
// The stream moves to the back of its subscription's queue (now()) if it
// has another open row, and is parked ('infinity') if the delivered row was
// its last. Rotated to now() either way, an emptied stream came round in a
// later claim's window only to be found empty and parked there: with one
// event at a time per stream (bench pipeline, 3,000 streams at 1 event/s
// each) half of every claim's window was such streams, each one more stream
// row version, and the claim returned that many fewer rows. The park
// follows the claim's rule (see claimSQL): streams holds what this
// statement's snapshot saw — whether another open row exists, and gen — and
// an emptied stream is parked only if gen is still that when its row is
// locked, so an insert (or revive) committing meanwhile, whose row the
// snapshot does not show, leaves the stream ready. Rows are taken with SKIP
// LOCKED as before: a stream an inserting transaction holds is left as that
// transaction sets it (ready).
const completeSQL = `
WITH o AS (
  SELECT * FROM unnest($2::bigint[], $3::int[], $4::int[]) AS o(id, attempts, status_code)
),
d AS (
  UPDATE bridge.deliveries d
  SET status = 'delivered', delivered_at = now(), lease_expires_at = NULL, claimed_by = NULL,
      last_status_code = o.status_code, last_error = NULL
  FROM o
  WHERE d.id = o.id AND d.claimed_by = $1 AND d.attempts = o.attempts AND d.status = 'delivering'
  RETURNING d.id, d.subscription_id, coalesce(d.asset_id, '') AS asset_key
),
s AS (
  UPDATE bridge.subscriptions s SET consecutive_failures = 0, updated_at = now()
  WHERE s.id IN (
    SELECT x.id FROM bridge.subscriptions x
    WHERE x.id IN (SELECT subscription_id FROM d) AND x.consecutive_failures <> 0
    ORDER BY x.id
    FOR UPDATE OF x)
),
streams AS MATERIALIZED (
  SELECT x.subscription_id, x.asset_key, x.gen,
         EXISTS (SELECT 1 FROM bridge.deliveries f
                 WHERE f.subscription_id = x.subscription_id AND coalesce(f.asset_id, '') = x.asset_key
                   AND f.status IN ('pending', 'delivering') AND f.id <> d.id) AS more
  FROM bridge.delivery_streams x JOIN d USING (subscription_id, asset_key)
),
to_move AS (
  SELECT y.subscription_id, y.asset_key, n.more
  FROM bridge.delivery_streams y JOIN streams n USING (subscription_id, asset_key)
  WHERE n.more OR y.gen = n.gen
  FOR UPDATE OF y SKIP LOCKED
),
st AS (
  UPDATE bridge.delivery_streams st SET ready_at = CASE WHEN m.more THEN now() ELSE 'infinity' END
  FROM to_move m
  WHERE st.subscription_id = m.subscription_id AND st.asset_key = m.asset_key
)
SELECT id FROM d`

// retrySQL: failed attempts with retries left, for a batch of claims of one
// claimer ($1; $2 ids, $3 attempts, $4 status codes, $5 errors, $6 the delay
// in microseconds). The subscription's failure count does not move — only
// deaths count.
const retrySQL = `
WITH o AS (
  SELECT * FROM unnest($2::bigint[], $3::int[], $4::int[], $5::text[], $6::bigint[])
    AS o(id, attempts, status_code, error, delay_us)
),
d AS (
  UPDATE bridge.deliveries d
  SET status = 'pending', next_attempt_at = now() + o.delay_us * interval '1 microsecond',
      lease_expires_at = NULL, claimed_by = NULL,
      last_status_code = o.status_code, last_error = nullif(o.error, '')
  FROM o
  WHERE d.id = o.id AND d.claimed_by = $1 AND d.attempts = o.attempts AND d.status = 'delivering'
  RETURNING d.id
)
SELECT id FROM d`

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
	// The deaths are announced in the reclaim's transaction.
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, reclaimStalledSQL, limit, maxAttempts)
		if err != nil {
			return err
		}
		reclaimed, err := pgx.CollectRows(rows, pgx.RowToStructByNameLax[reclaimedRow])
		if err != nil {
			return err
		}
		var evs []opEvent
		for _, r := range reclaimed {
			if r.Status != StatusDead {
				pending++
				continue
			}
			dead++
			c := &r.Claim
			if announceDeath(c, s.Operations) {
				evs = append(evs, deadEvent(c, contract.CauseLease, 0, "lease expired while in flight on the last allowed attempt"))
			}
		}
		return announce(ctx, tx, s.Operations, evs...)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("reclaim stalled deliveries: %w", err)
	}
	return pending, dead, nil
}

// reclaimedRow is one row reclaimStalledSQL returns.
type reclaimedRow struct {
	Status string `db:"status"`
	Claim
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

// Kind says what an outcome does to its delivery.
type Kind int

const (
	// Delivered: a 2xx.
	Delivered Kind = iota + 1
	// Retry: a failed attempt with attempts left; next try after RetryIn.
	Retry
)

// Result is one attempt's outcome for Record.
type Result struct {
	Claim   *Claim
	Kind    Kind
	Outcome Outcome
	RetryIn time.Duration // Retry only
}

// RecordOptions tune one Record.
type RecordOptions struct {
	// Async commits without waiting for the WAL flush
	// (synchronous_commit = off for this transaction only). A PostgreSQL
	// crash can then lose the last few hundred milliseconds of outcomes
	// (never corrupt them): those deliveries are 'delivering' again, and
	// reclaim sends them once more with the same webhook-id, which
	// at-least-once allows. Only successes and retries may be written so;
	// deaths, which disable subscriptions and are announced, are not.
	Async bool
}

// Record writes a batch of successes and retries of claimedBy's claims in
// one transaction and reports, per result, whether its claim was still
// current (false: reclaimed meanwhile; the attempt is logged, nothing else
// moves).
func (s *DeliveryStore) Record(ctx context.Context, claimedBy string, rs []Result, opt RecordOptions) ([]bool, error) {
	n := len(rs)
	att := attemptArrays{}
	var done, retry outcomeArrays
	for _, r := range rs {
		att.add(r.Claim, r.Outcome)
		switch r.Kind {
		case Delivered:
			done.add(r)
		case Retry:
			retry.add(r)
		default:
			return nil, fmt.Errorf("record outcome of delivery %d: unknown kind %d", r.Claim.ID, r.Kind)
		}
	}
	current := make(map[int64]bool, n)
	// One pgx batch is one implicit transaction and one round trip: the
	// attempts, the outcomes and the local synchronous_commit commit
	// together. BEGIN and COMMIT of their own made it three round trips per
	// batch, each a wait for the scheduler on a busy machine, while the
	// batch's deliveries still count against their subscription's cap.
	b := &pgx.Batch{}
	if opt.Async {
		b.Queue(`SELECT set_config('synchronous_commit', 'off', true)`)
	}
	b.Queue(insertAttemptsSQL, att.id, att.attempt, att.started, att.duration, att.status, att.err, att.body, att.trace)
	var collect []*pgx.QueuedQuery
	if len(done.id) > 0 {
		collect = append(collect, b.Queue(completeSQL, claimedBy, done.id, done.attempts, done.status))
	}
	if len(retry.id) > 0 {
		collect = append(collect, b.Queue(retrySQL, claimedBy, retry.id, retry.attempts, retry.status, retry.err, retry.delayUS))
	}
	for _, q := range collect {
		q.Query(func(rows pgx.Rows) error {
			ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			for _, id := range ids {
				current[id] = true
			}
			return err
		})
	}
	err := s.db.SendBatch(ctx, b).Close()
	if err != nil {
		return nil, fmt.Errorf("record %d outcomes: %w", n, err)
	}
	out := make([]bool, n)
	for i, r := range rs {
		out[i] = current[r.Claim.ID]
	}
	return out, nil
}

// attemptArrays are insertAttemptsSQL's parameters.
type attemptArrays struct {
	id               []int64
	attempt          []int32
	started          []time.Time
	duration         []float64
	status           []*int32
	err, body, trace []string
}

func (a *attemptArrays) add(c *Claim, o Outcome) {
	a.id = append(a.id, c.ID)
	a.attempt = append(a.attempt, int32(c.Attempts))
	a.started = append(a.started, o.StartedAt)
	a.duration = append(a.duration, float64(o.Duration)/float64(time.Millisecond))
	a.status = append(a.status, statusArg(o.StatusCode))
	a.err = append(a.err, o.Error)
	a.body = append(a.body, o.ResponseBody)
	a.trace = append(a.trace, o.TraceID)
}

// outcomeArrays are completeSQL's and retrySQL's parameters.
type outcomeArrays struct {
	id       []int64
	attempts []int32
	status   []*int32
	err      []string
	delayUS  []int64
}

func (a *outcomeArrays) add(r Result) {
	a.id = append(a.id, r.Claim.ID)
	a.attempts = append(a.attempts, int32(r.Claim.Attempts))
	a.status = append(a.status, statusArg(r.Outcome.StatusCode))
	a.err = append(a.err, r.Outcome.Error)
	a.delayUS = append(a.delayUS, r.RetryIn.Microseconds())
}

func statusArg(code int) *int32 {
	if code == 0 {
		return nil
	}
	c := int32(code)
	return &c
}

// Complete records a 2xx: delivered, and the subscription's failure count
// back to 0. It reports whether the claim was still current.
func (s *DeliveryStore) Complete(ctx context.Context, c *Claim, claimedBy string, o Outcome) (bool, error) {
	cur, err := s.Record(ctx, claimedBy, []Result{{Claim: c, Kind: Delivered, Outcome: o}}, RecordOptions{})
	if err != nil {
		return false, fmt.Errorf("complete delivery %d: %w", c.ID, err)
	}
	return cur[0], nil
}

// Retry records a failed attempt and schedules the next one after delay.
func (s *DeliveryStore) Retry(ctx context.Context, c *Claim, claimedBy string, o Outcome, delay time.Duration) (bool, error) {
	cur, err := s.Record(ctx, claimedBy, []Result{{Claim: c, Kind: Retry, Outcome: o, RetryIn: delay}}, RecordOptions{})
	if err != nil {
		return false, fmt.Errorf("schedule retry of delivery %d: %w", c.ID, err)
	}
	return cur[0], nil
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
	var att attemptArrays
	att.add(c, o)
	var r DeadResult
	var n int
	b := &pgx.Batch{}
	b.Queue(insertAttemptsSQL, att.id, att.attempt, att.started, att.duration, att.status, att.err, att.body, att.trace)
	b.Queue(deadSQL, c.ID, claimedBy, c.Attempts, statusArg(o.StatusCode), o.Error, disableAfter, gone).
		QueryRow(func(row pgx.Row) error {
			return row.Scan(&n, &r.Enabled, &r.ConsecutiveFailures, &r.DisabledReason, &r.DisabledNow)
		})
	if s.Operations == "" {
		// One pgx batch is one implicit transaction: the attempt and the
		// death commit together.
		if err := s.db.SendBatch(ctx, b).Close(); err != nil {
			return DeadResult{}, fmt.Errorf("mark delivery %d dead: %w", c.ID, err)
		}
		r.Current = n == 1
		return r, nil
	}
	// With operational events, the death, the disable and their
	// announcements commit together (store/operations.go).
	var at time.Time
	b.Queue(`SELECT now()`).QueryRow(func(row pgx.Row) error { return row.Scan(&at) })
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if n != 1 {
			return nil
		}
		return announce(ctx, tx, s.Operations, deathEvents(c, o, r, disableAfter, gone, s.Operations, at)...)
	})
	if err != nil {
		return DeadResult{}, fmt.Errorf("mark delivery %d dead: %w", c.ID, err)
	}
	r.Current = n == 1
	return r, nil
}
