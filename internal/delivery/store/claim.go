package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/keyring"
)

// The delivery claim over bridge.deliveries, bridge.delivery_streams and
// bridge.subscriptions.

// claimLockSQL runs in the claim's transaction, before the claim statement,
// and reviveLockSQL in the revive's. See DeliveryStore.Claim for the race.
//
// It also turns JIT off for the claim: the planner's cost estimate for the
// claim (per-subscription laterals over a large backlog) crosses
// jit_above_cost, and compiling it took ~900 ms on a 2-core machine for a
// statement that runs in ~10 ms. And it makes the claim use its generic
// plan: the plan's shape does not depend on the parameters (index probes per
// stream), while a custom plan was made for every claim — 1–3 ms of planning
// per claim on a quiet machine, up to 14 ms on a busy one, against 0.06 ms.
//
// A generic plan is made once per connection, at its first claim, and kept:
// when that is on a new or emptied database, it is planned for empty tables
// and kept while the backlog grows. Planned so, the claim scanned every
// pending row of a subscription and compared each with every row picked
// (450,000 comparisons, ~1 s per claim at 14,000 rows behind), claims got
// slower as the backlog grew, and `bench pipeline` fell behind for good
// (1,000 events/s × 3: 1,500 webhooks/s, p99 33 s). Sequential scans, hash
// and merge joins and bitmap scans are therefore off for the claim's
// transaction: the claim is meant to be index probes per stream joined by
// nested loops, and with them off that is the plan whatever the statistics
// said when it was made (the locked CTE's LATERAL fixes its join order too).
const claimLockSQL = `SELECT pg_advisory_xact_lock_shared(7411004), set_config('jit', 'off', true),
       set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// claimSubscriptionsSQL picks the subscriptions a claim serves: the enabled
// ones of this claim loop's share ($1 loops, this one $2) whose subscription
// lock (advisory, class 7411005) is free. The share is by rank: the servable
// subscriptions in id order, the i-th to loop i mod $1, so the loops' shares
// differ by at most one and every replica's loop k has the same share. It
// was a hash of the id mod $1, which with 3 subscriptions over 4 loops put
// two in one loop in ~60% of runs and all three in ~6% (those were the
// slowest bench pipeline runs: one serial loop claiming for all three while
// the others claimed for nothing). A subscription created, disabled or done
// copying its history moves the ranks after it; until every claim has seen
// that, two loops may both name one subscription, and its lock serves it to
// one of them at a time, so the cap stays exact. The lock is held until the claim
// commits; a subscription another claim holds is skipped, not waited for —
// that claim is serving it — and $3 counts them. The CASE makes sure only
// candidates are locked (a WHERE clause may evaluate its terms in any
// order). A hash collision only makes two subscriptions share a lock.
// A subscription whose history is still being copied is not served (see
// history.go: its history must go out before what was queued live).
//
// Rate limits (migration 00110): for each locked subscription with a
// rate_limit, rated refills its token bucket to now() — rate_limit tokens a
// second since rate_refilled_at, at most rate_burst — and locks its row,
// which claimSQL then debits by what it hands out. The bucket is shared by
// every replica because it is only ever moved under the subscription lock:
// two claims of one subscription never overlap, so none reads a bucket
// another is about to debit. The row lock is taken here, in id order (as
// completeSQL takes subscription rows) and while the claim holds nothing
// but advisory locks: taken by claimSQL's debit instead, after it has
// locked delivery and stream rows, it would wait on an outcome or a delete
// holding the subscription row while that one waits on those rows. now()
// is the transaction's time, the same in both statements; elapsed time is
// never negative and rate_refilled_at never moves back (a claim whose
// transaction began before the previous claim of the subscription
// committed must not refill the same interval twice). Unlimited
// subscriptions are neither locked nor written.
//
// What it found goes to claimSQL through three transaction-local settings
// (bridge.claim_subscriptions, bridge.claim_rated, bridge.claim_tokens)
// rather than back through this process: the two statements are then sent
// together, in one round trip (see ClaimShare). The settings end with the
// transaction; claimSQL run without this statement before it in its
// transaction fails (an unset or empty setting is no uuid[]), it never
// claims for subscriptions it does not hold.
const claimSubscriptionsSQL = `
WITH e AS (
  SELECT s.id, s.rate_limit > 0 AS limited, row_number() OVER (ORDER BY s.id) - 1 AS rank
  FROM bridge.subscriptions s
  WHERE s.enabled AND (s.history_since IS NULL OR s.history_done_at IS NOT NULL)
),
c AS (
  SELECT e.id, e.limited,
         CASE WHEN mod(e.rank, $1) = $2
              THEN pg_try_advisory_xact_lock(7411005, hashtext(e.id::text)) END AS locked
  FROM e
),
rated AS (
  SELECT s.id, s.rate_limit,
         least(s.rate_burst::float8, s.rate_tokens + s.rate_limit *
               greatest(0, extract(epoch FROM now() - s.rate_refilled_at)::float8)) AS tokens
  FROM bridge.subscriptions s
  WHERE s.id IN (SELECT id FROM c WHERE locked AND limited) AND s.rate_limit > 0
  ORDER BY s.id
  FOR NO KEY UPDATE OF s
)
SELECT x.subs, x.contended, x.rated, x.tokens, x.rates
FROM (
  SELECT coalesce(array_agg(id ORDER BY id) FILTER (WHERE locked), '{}') AS subs, count(*) FILTER (WHERE NOT locked) AS contended,
         (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM rated) AS rated,
         (SELECT coalesce(array_agg(tokens ORDER BY id), '{}') FROM rated) AS tokens,
         (SELECT coalesce(array_agg(rate_limit ORDER BY id), '{}') FROM rated) AS rates
  FROM c
) x
WHERE set_config('bridge.claim_subscriptions', x.subs::text, true) IS NOT NULL -- never false: sets them all
  AND set_config('bridge.claim_rated', x.rated::text, true) IS NOT NULL
  AND set_config('bridge.claim_tokens', x.tokens::text, true) IS NOT NULL`
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
// of a stream whose later row may be in flight right now. It is probed only
// for a pending head: a head in flight is busy by itself, and the streams in
// flight sit at the front of their subscription's queue (ready_at moves at
// their outcome), so with a cap of 128 most of a claim's window was streams
// in flight, each probed twice.
//
// Which streams to look at comes from bridge.delivery_streams: only those whose ready_at has come, per enabled subscription oldest
// first, at most what the subscription can take plus what it has in flight
// plus 8. The cost follows the batch, not the backlog. A subscription that
// can take nothing (at its cap, or out of rate tokens) is not looked at at
// all: its window was its cap's worth of streams in flight, each a head
// probe, in every claim of its loop — an endpoint taking 5 s per answer sits
// at its cap all the time, and the other subscriptions of its loop paid
// for it. Its parks wait for a claim that can take from it. A stream whose head
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
// subs is MATERIALIZED: inlined, its in-flight count ran once per stream
// looked at (720 index walks for a 200-row claim) instead of once per
// subscription.
//
// The per-subscription cap is exact across claimers (loops and replicas):
// only the subscriptions in bridge.claim_subscriptions are looked at, and those are the ones this
// transaction holds the subscription lock of (claimSubscriptionsSQL), taken
// in a statement before this one. Two claims of one subscription therefore
// never overlap, and the later one's snapshot sees the earlier one's claims,
// so free never counts a slot twice. (Outcomes committing meanwhile only
// make the count seen larger than the truth: a claim may take fewer, never
// more.)
//
// enabled is checked again here, in this statement's snapshot, although
// claimSubscriptionsSQL only returns enabled subscriptions: that statement's
// snapshot is older. A death that disables the subscription (410, or the
// WEBHOOK_DISABLE_AFTER-th death) can commit between the two; this
// statement then sees the dead head gone and its successor as the new head,
// and without the check would send it to the endpoint that just said 410
// (TestGoneDisablesAtOnce caught it). The death and the disable commit
// together, so a snapshot that sees the successor as head also sees the
// subscription disabled.
//
// Bytes: the claim stops once the payloads it returns reach $5 (the first
// row is always returned, so a budget below one payload still makes
// progress). payload_bytes is computed when the row is written (migration
// 00080), so no payload is read to decide. The deliverer passes what is left
// of its WEBHOOK_CLAIM_BYTES budget, which bounds its memory by bytes, not by
// rows × the largest payload.
//
// The lock step (locked) is one primary-key probe per row picked, and must
// stay one whatever the statistics say. Written d.status = 'pending', the
// check let the planner read a partial index whose predicate it implies
// (deliveries_open_by_stream, deliveries_waiting_by_subscription) in full
// for every row picked: a partial index's statistics move only at vacuum or
// analyze, so vacuumed while every row was delivered, it "holds nothing"
// and costs nothing to read however many rows were queued since — 99,634
// rows filtered per row picked, 15 s per claim over 100,000 pending behind
// 1,000,000 delivered (`bench deliver --delivered 1000000`), and a new
// deliverer's claims are planned on such statistics too. Written
// (d.status = 'pending') IS TRUE it implies no index predicate, so the
// primary key, on id, is the only index the probe can use
// (TestClaimLockProbeIgnoresStalePartialIndexStatistics). It is the same
// check (status is never NULL), re-checked on the locked row version like
// any other.
//
// The attempt is charged here, at claim: a worker killed mid-request has
// still sent it.
//
// Rate limits: a rate-limited subscription takes at most its whole tokens
// (bridge.claim_rated ids, bridge.claim_tokens their buckets, refilled and
// locked by claimSubscriptionsSQL)
// and rated debits one per delivery claimed, so a token is spent exactly
// when an attempt is charged. Waiting for tokens is no attempt: nothing is
// claimed, nothing is charged, no backoff is scheduled. One that became
// limited after claimSubscriptionsSQL ran (not in bridge.claim_rated) takes nothing this
// time. The others are not affected (take = free).
//
// Breakers (the deliverer's, see delivery.breakers): a subscription in $6
// takes nothing, one in $7 at most one head and only while none of its
// deliveries is delivering (free = the cap), so an endpoint failing every
// stream gets one probe at a time. Like a wait for tokens, it is no
// attempt: nothing is charged or rescheduled.
const claimSQL = `
WITH subs AS MATERIALIZED (
  SELECT f.id, f.free,
         CASE WHEN f.id = ANY($6::uuid[]) THEN 0
              WHEN f.id = ANY($7::uuid[]) AND f.free < $2::int THEN 0
              WHEN f.rate_limit > 0 THEN least(f.free, coalesce(floor(r.tokens)::int, 0),
                                               CASE WHEN f.id = ANY($7::uuid[]) THEN 1 ELSE f.free END)
              WHEN f.id = ANY($7::uuid[]) THEN least(f.free, 1)
              ELSE f.free END AS take
  FROM (
    SELECT s.id, s.rate_limit,
           greatest(0, $2::int - (SELECT count(*) FROM bridge.deliveries g
                                  WHERE g.subscription_id = s.id AND g.status = 'delivering'))::int AS free
    FROM bridge.subscriptions s
    WHERE s.id = ANY(current_setting('bridge.claim_subscriptions')::uuid[]) AND s.enabled
  ) f
  LEFT JOIN unnest(current_setting('bridge.claim_rated')::uuid[], current_setting('bridge.claim_tokens')::float8[])
    AS r(id, tokens) ON r.id = f.id
),
ready AS (
  SELECT r.subscription_id, r.asset_key, r.gen, subs.take
  FROM subs
  CROSS JOIN LATERAL (
    SELECT st.subscription_id, st.asset_key, st.gen
    FROM bridge.delivery_streams st
    WHERE st.subscription_id = subs.id AND st.ready_at <= now()
    ORDER BY st.ready_at
    LIMIT CASE WHEN subs.take > 0 THEN least($3::int, subs.take) + ($2::int - subs.free) + 8 ELSE 0 END
  ) r
),
heads AS (
  SELECT r.subscription_id, r.asset_key, r.gen, r.take, h.id, h.seq, h.status, h.next_attempt_at, h.payload_bytes,
         CASE WHEN h.status = 'pending'
              THEN coalesce((SELECT 1 FROM bridge.deliveries f
                             WHERE f.subscription_id = r.subscription_id
                               AND coalesce(f.asset_id, '') = r.asset_key
                               AND f.status = 'delivering'
                             LIMIT 1), 0) = 1
              ELSE true END AS busy
  FROM ready r
  LEFT JOIN LATERAL (
    SELECT d.id, d.seq, d.status, d.next_attempt_at, d.payload_bytes
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
    SELECT id, payload_bytes, sum(payload_bytes) OVER (ORDER BY turn, seq) AS running
    FROM (
      SELECT id, seq, take, payload_bytes, row_number() OVER (PARTITION BY subscription_id ORDER BY seq) AS turn
      FROM heads
      WHERE status = 'pending' AND next_attempt_at <= now() AND NOT busy
    ) c
    WHERE turn <= take
    ORDER BY turn, seq
    LIMIT $3
  ) b
  WHERE running - payload_bytes < $5::bigint -- the row starts within the byte budget (the first always does)
),
locked AS (
  SELECT l.id FROM picked p
  CROSS JOIN LATERAL (
    SELECT d.id FROM bridge.deliveries d
    WHERE d.id = p.id AND (d.status = 'pending') IS TRUE
    FOR UPDATE SKIP LOCKED
  ) l
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
),
rated AS (
  UPDATE bridge.subscriptions s
  SET rate_tokens = r.tokens - k.n, rate_refilled_at = greatest(s.rate_refilled_at, now())
  FROM unnest(current_setting('bridge.claim_rated')::uuid[], current_setting('bridge.claim_tokens')::float8[]) AS r(id, tokens),
       (SELECT subscription_id, count(*) AS n FROM claimed GROUP BY subscription_id) k
  WHERE s.id = r.id AND k.subscription_id = r.id
)
SELECT c.id, c.seq, c.subscription_id::text AS subscription_id, c.event_id, c.event_type, c.topic, c.asset_id, c.asset_seq,
       c.payload::text AS payload, c.event_created_at, coalesce(c.traceparent, '') AS traceparent,
       coalesce(c.tracestate, '') AS tracestate, c.attempts, s.url,
       ` + validSecretsExpr + ` AS secrets,
       c.revived_at IS NOT NULL AS revived, c.payload_bytes
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
	// SecretsErr is why Secrets could not be opened (a key missing from
	// BRIDGE_SECRET_KEYS, a tampered value); Secrets is then nil. The
	// attempt fails naming it instead of the whole claim failing, so one
	// subscription's bad secret does not stop every other's deliveries.
	SecretsErr error `db:"-"`
	// Revived is true once an operator revived this delivery (dead →
	// pending): its spans say so, still in the original trace.
	Revived bool `db:"revived"`
	// PayloadBytes is the payload's size as JSON text (what the claim's
	// byte budget counted).
	PayloadBytes int `db:"payload_bytes"`
}

// DeliveryStore is the deliveries queue and its log.
type DeliveryStore struct {
	db DB
	// Operations is the topic of the operational events a death, a disable
	// and a warning enqueue (BRIDGE_OPERATIONS_TOPIC); "" announces nothing.
	Operations string
	// keys opens the signing secrets a claim returns (WithKeys).
	keys *keyring.Ring
	// readClaims reads the claim's rows; nil: collectClaims. A test makes
	// it fail to show that claims which could not be read are given back.
	readClaims func(pgx.Rows) ([]Claim, error)
}

func collectClaims(rows pgx.Rows) ([]Claim, error) {
	return pgx.CollectRows(rows, pgx.RowToStructByName[Claim])
}

// NewDeliveryStore returns a store on db.
func NewDeliveryStore(db DB) *DeliveryStore { return &DeliveryStore{db: db} }

// WithKeys makes claims open sealed signing secrets with keys
// (BRIDGE_SECRET_KEYS) and returns the store.
func (s *DeliveryStore) WithKeys(keys *keyring.Ring) *DeliveryStore {
	s.keys = keys
	return s
}

// ClaimParams bound one claim.
type ClaimParams struct {
	ClaimedBy   string
	Limit       int
	MaxInFlight int // per subscription
	Lease       time.Duration
	// Loops and Loop: the claim serves subscriptions of share Loop of
	// Loops (0 ≤ Loop < Loops); zero Loops means one share, all of them.
	Loops, Loop int
	// Bytes bounds the payload bytes the claim returns (the first row is
	// always returned); zero means no bound.
	Bytes int
	// Reserve, when set, is called before the claim is sent; it returns
	// the Limit and Bytes to claim with (a zero limit claims nothing and
	// sends nothing). The claimer reserves its slots there. It learns how
	// many subscriptions its share serves from the previous claim's
	// ClaimResult.Subscriptions, so it reserves at most what they can take:
	// the claim goes out in one round trip with the statements that find
	// and lock those subscriptions, so it cannot be asked in between.
	Reserve func() (limit, bytes int)
	// Held subscriptions take nothing, and Probing ones at most one head,
	// only when none of their deliveries is delivering: the deliverer's
	// breakers (an endpoint failing every stream is probed, not sent every
	// due head).
	Held, Probing []string
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
	out, err := s.ClaimShare(ctx, p)
	return out.Claims, err
}

// ClaimResult is what one claim of a share found.
type ClaimResult struct {
	Claims []Claim
	// Subscriptions counts the subscriptions of the share this claim served
	// (held the lock of): what the next claim of the share should reserve
	// for (ClaimParams.Reserve).
	Subscriptions int
	// Contended counts the subscriptions of the share skipped because
	// another claim was serving them (try again soon).
	Contended int
	// RateWait, when not zero, is how long until a rate-limited
	// subscription that this claim left without a whole token gets its next
	// one: the claimer should look again then. Its deliveries wait in the
	// database meanwhile, so an engine that would otherwise sleep until its
	// poll tick (or poll in a loop) wakes when there is something to send.
	RateWait time.Duration
}

// ClaimShare is Claim for share p.Loop of p.Loops, also reporting the
// contention and the rate limits it met.
//
// Its statements — the revive lock (claimLockSQL), the subscriptions and
// their locks (claimSubscriptionsSQL), the claim (claimSQL) — go out
// together, one transaction in one round trip. Sent as BEGIN with the first
// two, then the claim with COMMIT once this process had read which
// subscriptions it held, the transaction sat idle between its round trips
// holding the subscriptions' locks (0.6–0.9 backends on average in bench
// pipeline), and BEGIN and COMMIT were two statements more per claim. The
// statements keep their order, so the lock order and the reasoning above
// (and at claimSQL) are unchanged: the claim's snapshot follows both locks.
func (s *DeliveryStore) ClaimShare(ctx context.Context, p ClaimParams) (ClaimResult, error) {
	var res ClaimResult
	var subs, rated []string
	var tokens []float64
	var rates []int32
	loops := max(p.Loops, 1)
	if p.Reserve != nil {
		if p.Limit, p.Bytes = p.Reserve(); p.Limit <= 0 {
			return res, nil
		}
	}
	budget := int64(p.Bytes)
	if budget <= 0 {
		budget = math.MaxInt64
	}
	held, probing := p.Held, p.Probing
	if held == nil {
		held = []string{}
	}
	if probing == nil {
		probing = []string{}
	}
	claimArgs := []any{p.ClaimedBy, p.MaxInFlight, p.Limit, p.Lease, budget, held, probing}
	// readErr: a result this process could not read (see claimPipelined).
	var readErr error
	first := func(b *pgx.Batch) {
		b.Queue(claimLockSQL)
		b.Queue(claimSubscriptionsSQL, loops, p.Loop).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&subs, &res.Contended, &rated, &tokens, &rates)
			if pgErr := (*pgconn.PgError)(nil); err != nil && !errors.As(err, &pgErr) {
				readErr = err // the claim runs anyway: read on, so that it can be given back
				return nil
			}
			return err
		})
	}
	var err error
	if pool, ok := s.db.(*pgxpool.Pool); ok {
		err = s.claimPipelined(ctx, pool, first, claimArgs, &readErr, &res.Claims)
	} else {
		err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			first(b)
			b.Queue(claimSQL, claimArgs...).Query(func(rows pgx.Rows) error {
				var err error
				res.Claims, err = s.read(rows)
				return err // a claim that could not be read rolls back with the transaction
			})
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			return readErr // rolls back
		})
	}
	if err != nil {
		return ClaimResult{}, fmt.Errorf("claim deliveries: %w", err)
	}
	res.Subscriptions = len(subs)
	for i := range res.Claims {
		if res.Claims[i].Secrets, err = openSecrets(s.keys, res.Claims[i].SubscriptionID, res.Claims[i].Secrets); err != nil {
			res.Claims[i].SecretsErr = err
		}
	}
	res.RateWait = rateWait(res.Claims, rated, tokens, rates)
	return res, nil
}

// claimPipelined runs a claim's transaction on pool in one round trip: one
// pgx batch is one implicit transaction (its statements, then one Sync), so
// no BEGIN or COMMIT is sent. A statement that fails makes PostgreSQL skip
// the rest and roll the transaction back, and the claims are returned only
// once the batch has ended: a delivery is never sent on a claim that was
// not committed.
//
// The transaction commits at the batch's end, so it also commits claims
// whose rows this process then fails to read (a scan error: the claim ran,
// its result does not fit Claim). Those rows would sit 'delivering' with an
// attempt charged, unsent, until their lease ran out. So the claim's
// transaction id is read after it, and such a claim is undone at once by
// unclaimSQL: its rows pending again, their attempt not charged, as if it
// had rolled back (TestClaimThatCannotBeReadIsGivenBack).
//
// readErr is shared with first's statements: the subscriptions' row that
// could not be read is such a failure too (the claim after it ran).
func (s *DeliveryStore) claimPipelined(ctx context.Context, pool *pgxpool.Pool, first func(*pgx.Batch), args []any, readErr *error, into *[]Claim) error {
	var claims []Claim
	var xid *string
	b := &pgx.Batch{}
	first(b)
	// Fn, not Query: Query's wrapper returns the rows' error, which would
	// stop the batch before the transaction id is read.
	b.Queue(claimSQL, args...).Fn = func(br pgx.BatchResults) error {
		rows, _ := br.Query()
		var err error
		claims, err = s.read(rows)
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		var pgErr *pgconn.PgError
		if err == nil || errors.As(err, &pgErr) {
			return err // a claim that failed: PostgreSQL rolls the transaction back
		}
		if *readErr == nil {
			*readErr = err // read on, so that the transaction id comes back
		}
		return nil
	}
	b.Queue(`SELECT pg_current_xact_id_if_assigned()::text`).QueryRow(func(row pgx.Row) error { return row.Scan(&xid) })
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if *readErr != nil {
		if xid != nil {
			if _, err := pool.Exec(ctx, unclaimSQL, args[0], *xid); err != nil {
				return fmt.Errorf("%w; giving its claims back failed too, they return when their lease expires: %v", *readErr, err)
			}
		}
		return *readErr
	}
	*into = claims
	return nil
}

// unclaimSQL gives back the claims of claimer $1 made by the committed
// transaction $2 (see claimPipelined), as releaseSQL does: pending again,
// attempt not charged. Rate tokens the claim spent stay spent.
const unclaimSQL = `
UPDATE bridge.deliveries
SET status = 'pending', attempts = attempts - 1, lease_expires_at = NULL, claimed_by = NULL
WHERE claimed_by = $1 AND status = 'delivering' AND xmin = $2::text::xid8::xid`

func (s *DeliveryStore) read(rows pgx.Rows) ([]Claim, error) {
	if s.readClaims != nil {
		return s.readClaims(rows)
	}
	return collectClaims(rows)
}

// rateWait is ClaimResult.RateWait: the soonest next whole token of the
// rate-limited subscriptions that took every whole token they had (tokens
// as claimSubscriptionsSQL refilled them, rates their rate_limit). One that
// took fewer than it could was not held back by its limit (no backlog, its
// in-flight cap, the claim's size): what frees it is an outcome or a new
// delivery, which wake the claimer anyway. So an idle limited subscription
// costs at most one extra claim, when its last token comes back.
func rateWait(claims []Claim, rated []string, tokens []float64, rates []int32) time.Duration {
	if len(rated) == 0 {
		return 0
	}
	took := map[string]int{}
	for _, c := range claims {
		took[c.SubscriptionID]++
	}
	var soonest time.Duration
	for i, id := range rated {
		n := float64(took[id])
		if n < math.Floor(tokens[i]) || rates[i] <= 0 {
			continue
		}
		// After the claim the bucket holds tokens-n (< 1); it refills by
		// rates[i] a second.
		wait := time.Duration((1 - (tokens[i] - n)) / float64(rates[i]) * float64(time.Second))
		wait = max(wait, time.Millisecond) // the bucket's float rounding must not make a busy loop
		if soonest == 0 || wait < soonest {
			soonest = wait
		}
	}
	return soonest
}
