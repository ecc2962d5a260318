package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The delivery claim over bridge.deliveries, bridge.delivery_streams and
// bridge.subscriptions.

// claimLockSQL runs in the claim's transaction, before the claim statement,
// and reviveLockSQL in the revive's. See DeliveryStore.Claim for the race.
//
// It also turns JIT off for the claim: the planner's cost estimate for the
// claim (per-subscription laterals over a large backlog) crosses
// jit_above_cost, and compiling it took ~900 ms on a 2-core machine for a
// statement that runs in ~10 ms.
const claimLockSQL = `SELECT pg_advisory_xact_lock_shared(7411004), set_config('jit', 'off', true)`
const reviveLockSQL = `SELECT pg_advisory_xact_lock(7411004)`

// claimSQL hands out at most one delivery per (subscription, asset): the
// stream's head, and only when nothing of that stream is in flight.
//
// The race it prevents: two workers each check "no earlier delivery of (S, X)
// is pending or delivering", both see none, both claim, and two of X's events
// reach S at once, in either order. Here the head lookup, the
// row lock and the update are one statement. The head H of stream (S, X) is
// its lowest-seq open row. A second worker whose snapshot predates the first
// worker's commit also sees H as the head and pending, so it tries only H —
// locked: SKIP LOCKED skips it — never H's successor. One whose snapshot
// follows the commit sees H delivering and skips the stream. If the lock is
// taken just after the first worker committed, PostgreSQL re-checks the
// locked row's status (EvalPlanQual) and drops it.
//
// "Nothing in flight" (busy) matters for a revived row, which reopens in front
// of a stream whose later row may be in flight right now.
//
// Which streams to look at comes from bridge.delivery_streams: only those whose ready_at has come, per enabled subscription oldest
// first, at most what the subscription can take plus what it has in flight
// plus 8. The cost follows the batch, not the backlog. A stream whose head
// waits for a retry is parked: ready_at moves to the head's next_attempt_at,
// so however many rows wait behind it, it is not looked at until then (it was
// 640 ms per claim with 20,000 rows behind one retrying head when the claim
// walked rows). A stream with no open row is parked at 'infinity'. A park
// happens only if the stream's gen is still the one read: an insert (trigger)
// and a revive, the only things that can make a parked stream claimable
// sooner, bump gen, so a park never hides a claimable head. A stream in
// flight stays ready and is skipped (busy, one index probe); its outcome sets
// ready_at to now(), which sends it to the back of its subscription's queue:
// round-robin across a subscription's assets.
//
// Parks and rotations are hints, so they take stream rows with SKIP LOCKED:
// a stream row someone else is writing (a consumer's insert holds it until
// commit) is left for the next claim rather than waited for. Waiting here
// deadlocked: a claim parking several streams, an outcome holding a stream
// and wanting its subscription row, another outcome holding the
// subscription row and wanting a stream (found by
// TestClaimInvariantHoldsThroughRetriesDeathsAndRevives). Writers that must
// not skip (the insert trigger, revive) take several stream rows in
// (subscription_id, asset_key) order.
//
// The null asset is one stream: asset_key and the probes use the coalesce of
// asset_id to the empty string (as IS NOT DISTINCT FROM would match NULL with
// NULL), the expression deliveries_open_by_stream and
// deliveries_in_flight_by_stream are built on.
//
// Fairness: each enabled subscription takes at most its free slots ($2, the
// per-subscription cap, minus what it has in flight), and the batch ($3) is
// filled round-robin — every subscription's first head before any
// subscription's second — so one busy subscription cannot take every worker.
//
// The attempt is charged here, at claim: a worker killed mid-request has
// still sent it.
const claimSQL = `
WITH subs AS (
  SELECT s.id,
         greatest(0, $2::int - (SELECT count(*) FROM bridge.deliveries g
                                WHERE g.subscription_id = s.id AND g.status = 'delivering'))::int AS free
  FROM bridge.subscriptions s
  WHERE s.enabled
),
ready AS (
  SELECT r.subscription_id, r.asset_key, r.gen, subs.free
  FROM subs
  CROSS JOIN LATERAL (
    SELECT st.subscription_id, st.asset_key, st.gen
    FROM bridge.delivery_streams st
    WHERE st.subscription_id = subs.id AND st.ready_at <= now()
    ORDER BY st.ready_at
    LIMIT least($3::int, subs.free) + ($2::int - subs.free) + 8
  ) r
),
heads AS (
  SELECT r.subscription_id, r.asset_key, r.gen, r.free, h.id, h.seq, h.status, h.next_attempt_at,
         coalesce((SELECT 1 FROM bridge.deliveries f
                   WHERE f.subscription_id = r.subscription_id
                     AND coalesce(f.asset_id, '') = r.asset_key
                     AND f.status = 'delivering'
                   LIMIT 1), 0) = 1 AS busy
  FROM ready r
  LEFT JOIN LATERAL (
    SELECT d.id, d.seq, d.status, d.next_attempt_at
    FROM bridge.deliveries d
    WHERE d.subscription_id = r.subscription_id
      AND coalesce(d.asset_id, '') = r.asset_key
      AND d.status IN ('pending', 'delivering')
    ORDER BY d.seq
    LIMIT 1
  ) h ON true
),
picked AS (
  SELECT id FROM (
    SELECT id, seq, free, row_number() OVER (PARTITION BY subscription_id ORDER BY seq) AS turn
    FROM heads
    WHERE status = 'pending' AND next_attempt_at <= now() AND NOT busy
  ) c
  WHERE turn <= free
  ORDER BY turn, seq
  LIMIT $3
),
locked AS (
  SELECT d.id FROM bridge.deliveries d
  WHERE d.id IN (SELECT id FROM picked) AND d.status = 'pending'
  FOR UPDATE SKIP LOCKED
),
claimed AS (
  UPDATE bridge.deliveries d
  SET status = 'delivering',
      attempts = d.attempts + 1,
      lease_expires_at = now() + $4::interval,
      claimed_by = $1
  FROM locked l
  WHERE d.id = l.id
  RETURNING d.*
),
to_park AS (
  SELECT st.subscription_id, st.asset_key,
         CASE WHEN h.id IS NULL THEN 'infinity' ELSE h.next_attempt_at END AS ready_at
  FROM bridge.delivery_streams st
  JOIN heads h ON st.subscription_id = h.subscription_id AND st.asset_key = h.asset_key
  WHERE st.gen = h.gen
    AND (h.id IS NULL OR (h.status = 'pending' AND NOT h.busy AND h.next_attempt_at > now()))
  FOR UPDATE OF st SKIP LOCKED
),
parked AS (
  UPDATE bridge.delivery_streams st SET ready_at = p.ready_at
  FROM to_park p
  WHERE st.subscription_id = p.subscription_id AND st.asset_key = p.asset_key
)
SELECT c.id, c.seq, c.subscription_id::text AS subscription_id, c.event_id, c.event_type, c.topic, c.asset_id, c.asset_seq,
       c.payload::text AS payload, c.event_created_at, coalesce(c.traceparent, '') AS traceparent,
       coalesce(c.tracestate, '') AS tracestate, c.attempts, s.url,
       ` + validSecretsExpr + ` AS secrets,
       c.revived_at IS NOT NULL AS revived
FROM claimed c JOIN bridge.subscriptions s ON s.id = c.subscription_id
ORDER BY c.seq`

// Delivery statuses (the contract).
const (
	StatusPending    = "pending"
	StatusDelivering = "delivering"
	StatusDelivered  = "delivered"
	StatusDead       = "dead"
)

// Claim is one delivery handed to this worker: everything the request needs.
type Claim struct {
	ID             int64     `db:"id"`
	Seq            int64     `db:"seq"`
	SubscriptionID string    `db:"subscription_id"`
	EventID        string    `db:"event_id"`
	EventType      string    `db:"event_type"`
	Topic          string    `db:"topic"`
	AssetID        *string   `db:"asset_id"`
	AssetSeq       *int64    `db:"asset_seq"`
	Payload        []byte    `db:"payload"`
	EventCreatedAt time.Time `db:"event_created_at"`
	Traceparent    string    `db:"traceparent"`
	Tracestate     string    `db:"tracestate"`
	// Attempts counts this one (charged at claim). Together with the
	// claimer's id it identifies the claim: an outcome for an older claim of
	// the same row changes nothing.
	Attempts int      `db:"attempts"`
	URL      string   `db:"url"`
	Secrets  []string `db:"secrets"`
	// Revived is true once an operator revived this delivery (dead →
	// pending): its spans say so, still in the original trace.
	Revived bool `db:"revived"`
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
		out, err = pgx.CollectRows(rows, pgx.RowToStructByName[Claim])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	for i := range out {
		if out[i].Secrets, err = openSecrets(out[i].Secrets); err != nil {
			return nil, fmt.Errorf("claim deliveries: %w", err)
		}
	}
	return out, nil
}
