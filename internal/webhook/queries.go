package webhook

// Every SQL statement of the delivery engine lives here, one named constant
// each, grouped by table. None is assembled at run time; optional filters are
// `($n IS NULL OR column = $n)`.

// bridge.subscriptions -------------------------------------------------------

const insertSubscriptionSQL = `
INSERT INTO bridge.subscriptions AS s (url, description, event_types, topic)
VALUES ($1, $2, $3, nullif($4, ''))
RETURNING s.id::text, s.url, s.description, s.event_types, coalesce(s.topic, ''), s.enabled,
       coalesce(s.disabled_reason, ''), s.disabled_at, s.consecutive_failures, s.created_at, s.updated_at`

const getSubscriptionSQL = `
SELECT s.id::text, s.url, s.description, s.event_types, coalesce(s.topic, ''), s.enabled,
       coalesce(s.disabled_reason, ''), s.disabled_at, s.consecutive_failures, s.created_at, s.updated_at
FROM bridge.subscriptions s WHERE s.id = $1`

const listSubscriptionsSQL = `
SELECT s.id::text, s.url, s.description, s.event_types, coalesce(s.topic, ''), s.enabled,
       coalesce(s.disabled_reason, ''), s.disabled_at, s.consecutive_failures, s.created_at, s.updated_at
FROM bridge.subscriptions s ORDER BY s.created_at, s.id`

// updateSubscriptionSQL changes only the fields whose parameter is not NULL;
// $5 is the topic and $6 says whether to set it (an empty topic clears the filter).
const updateSubscriptionSQL = `
UPDATE bridge.subscriptions s SET
  url = coalesce($2, s.url),
  description = coalesce($3, s.description),
  event_types = coalesce($4, s.event_types),
  topic = CASE WHEN $6::boolean THEN nullif($5, '') ELSE s.topic END,
  updated_at = now()
WHERE s.id = $1
RETURNING s.id::text, s.url, s.description, s.event_types, coalesce(s.topic, ''), s.enabled,
       coalesce(s.disabled_reason, ''), s.disabled_at, s.consecutive_failures, s.created_at, s.updated_at`

const disableSubscriptionSQL = `
UPDATE bridge.subscriptions s SET enabled = false, disabled_reason = $2, disabled_at = now(), updated_at = now()
WHERE s.id = $1
RETURNING s.id::text, s.url, s.description, s.event_types, coalesce(s.topic, ''), s.enabled,
       coalesce(s.disabled_reason, ''), s.disabled_at, s.consecutive_failures, s.created_at, s.updated_at`

// enableSubscriptionSQL resets consecutive_failures: the operator says the
// endpoint is fixed, so the next death starts a new count.
const enableSubscriptionSQL = `
UPDATE bridge.subscriptions s SET enabled = true, disabled_reason = NULL, disabled_at = NULL,
  consecutive_failures = 0, updated_at = now()
WHERE s.id = $1
RETURNING s.id::text, s.url, s.description, s.event_types, coalesce(s.topic, ''), s.enabled,
       coalesce(s.disabled_reason, ''), s.disabled_at, s.consecutive_failures, s.created_at, s.updated_at`

const deleteSubscriptionSQL = `DELETE FROM bridge.subscriptions WHERE id = $1`

// bridge.subscription_secrets --------------------------------------------------

const insertSecretSQL = `INSERT INTO bridge.subscription_secrets (subscription_id, secret) VALUES ($1, $2)`

// expireCurrentSecretsSQL starts the grace period of the secret being rotated
// out: until expires_at it keeps signing beside the new one, so a receiver can
// switch without rejecting a delivery.
const expireCurrentSecretsSQL = `
UPDATE bridge.subscription_secrets SET expires_at = now() + $2::interval
WHERE subscription_id = $1 AND expires_at IS NULL`

const pruneExpiredSecretsSQL = `
DELETE FROM bridge.subscription_secrets WHERE subscription_id = $1 AND expires_at <= now()`

// listSecretsSQL returns secret metadata, never the secret itself.
const listSecretsSQL = `
SELECT id, created_at, expires_at FROM bridge.subscription_secrets
WHERE subscription_id = $1 AND (expires_at IS NULL OR expires_at > now())
ORDER BY id`

// validSecretsSQL returns the secrets that sign a request now, newest first.
const validSecretsSQL = `
SELECT secret FROM bridge.subscription_secrets
WHERE subscription_id = $1 AND (expires_at IS NULL OR expires_at > now())
ORDER BY id DESC`

// bridge.deliveries ------------------------------------------------------------

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
// reach S at once, in either order (HARD-PARTS 6). Here the head lookup, the
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
// Which streams to look at comes from bridge.delivery_streams (migration
// 00005): only those whose ready_at has come, per enabled subscription oldest
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
SELECT c.id, c.seq, c.subscription_id::text, c.event_id, c.event_type, c.topic, c.asset_id, c.asset_seq,
       c.payload::text, c.event_created_at, coalesce(c.traceparent, ''), coalesce(c.tracestate, ''),
       c.attempts, s.url,
       ARRAY(SELECT k.secret FROM bridge.subscription_secrets k
             WHERE k.subscription_id = c.subscription_id AND (k.expires_at IS NULL OR k.expires_at > now())
             ORDER BY k.id DESC),
       c.revived_at IS NOT NULL
FROM claimed c JOIN bridge.subscriptions s ON s.id = c.subscription_id
ORDER BY c.seq`

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
  RETURNING d.id, d.status
)
SELECT id, status FROM r`

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

// reviveSQL: dead → pending with attempts reset (the operator has just fixed
// the endpoint; one attempt left would make the button useless). Revived rows
// keep their seq, so they go out in their original order.
const reviveSQL = `
WITH d AS (
  UPDATE bridge.deliveries
  SET status = 'pending', attempts = 0, next_attempt_at = now(), revived_at = now(), last_error = NULL
  WHERE id = ANY($1::bigint[]) AND status = 'dead'
  RETURNING id, seq, subscription_id, coalesce(asset_id, '') AS asset_key
),
st AS (
  INSERT INTO bridge.delivery_streams AS st (subscription_id, asset_key, ready_at)
  SELECT DISTINCT subscription_id, asset_key, now() FROM d ORDER BY 1, 2
  ON CONFLICT (subscription_id, asset_key) DO UPDATE SET ready_at = now(), gen = st.gen + 1
)
SELECT id FROM d ORDER BY seq`

const reviveSubscriptionSQL = `
WITH d AS (
  UPDATE bridge.deliveries
  SET status = 'pending', attempts = 0, next_attempt_at = now(), revived_at = now(), last_error = NULL
  WHERE subscription_id = $1 AND status = 'dead'
  RETURNING id, seq, subscription_id, coalesce(asset_id, '') AS asset_key
),
st AS (
  INSERT INTO bridge.delivery_streams AS st (subscription_id, asset_key, ready_at)
  SELECT DISTINCT subscription_id, asset_key, now() FROM d ORDER BY 1, 2
  ON CONFLICT (subscription_id, asset_key) DO UPDATE SET ready_at = now(), gen = st.gen + 1
)
SELECT id FROM d ORDER BY seq`

// pruneDeliveredSQL deletes up to $2 delivered deliveries older than $1
// (their attempts go by ON DELETE CASCADE). SKIP LOCKED: replicas pruning at
// once take different rows. Dead ones are kept for revive.
const pruneDeliveredSQL = `
DELETE FROM bridge.deliveries
WHERE id IN (
  SELECT id FROM bridge.deliveries
  WHERE status = 'delivered' AND delivered_at < now() - $1::interval
  ORDER BY delivered_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED)`

// The log. These queries deliberately leave out payload: the log is
// the most-run query and must never be a way to read a tenant's history.

// listDeliveriesSQL pages newest first by id ($5: the last id of the previous
// page, NULL for the first); $6 event type, $7/$8 a created_at range (NULL:
// any).
const listDeliveriesSQL = `
SELECT d.id, d.seq, d.subscription_id::text, d.event_id, d.event_type, d.topic, d.asset_id, d.asset_seq,
       d.status, d.attempts, d.next_attempt_at, d.lease_expires_at, coalesce(d.claimed_by, ''), coalesce(d.last_error, ''),
       d.last_status_code, d.created_at, d.event_created_at, d.delivered_at, d.dead_at, d.revived_at
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

const getDeliverySQL = `SELECT d.id, d.seq, d.subscription_id::text, d.event_id, d.event_type, d.topic, d.asset_id, d.asset_seq,
       d.status, d.attempts, d.next_attempt_at, d.lease_expires_at, coalesce(d.claimed_by, ''), coalesce(d.last_error, ''),
       d.last_status_code, d.created_at, d.event_created_at, d.delivered_at, d.dead_at, d.revived_at FROM bridge.deliveries d WHERE d.id = $1`

// getPayloadSQL is the one deliberate way to read a payload
// (`bridge deliveries show ID --payload`).
const getPayloadSQL = `SELECT payload::text FROM bridge.deliveries WHERE id = $1`

const deliveryExistsSQL = `SELECT EXISTS (SELECT 1 FROM bridge.deliveries WHERE id = $1)`

// bridge.delivery_attempts -------------------------------------------------------

const listAttemptsSQL = `
SELECT attempt, started_at, duration_ms, status_code, coalesce(error, ''), coalesce(response_body, ''), coalesce(trace_id, '')
FROM bridge.delivery_attempts
WHERE delivery_id = $1
ORDER BY attempt, id`

// Console views (inspect.go) -------------------------------------------------

// subscriptionHealthSQL: the counts per status are index-only probes on
// deliveries_by_subscription_status; the attempts of the last hour are a
// range on delivery_attempts_started_at (migration 00040).
const subscriptionHealthSQL = `
WITH a AS (
  SELECT d.subscription_id,
         count(*) AS total,
         count(*) FILTER (WHERE x.status_code BETWEEN 200 AND 299) AS ok,
         count(*) FILTER (WHERE x.status_code BETWEEN 200 AND 299 AND x.started_at > now() - interval '1 minute') AS ok_minute
  FROM bridge.delivery_attempts x JOIN bridge.deliveries d ON d.id = x.delivery_id
  WHERE x.started_at > now() - interval '1 hour'
  GROUP BY 1)
SELECT s.id::text,
       (SELECT count(*) FROM bridge.deliveries d WHERE d.subscription_id = s.id AND d.status = 'pending'),
       (SELECT count(*) FROM bridge.deliveries d WHERE d.subscription_id = s.id AND d.status = 'delivering'),
       (SELECT count(*) FROM bridge.deliveries d WHERE d.subscription_id = s.id AND d.status = 'dead'),
       coalesce(a.total, 0), coalesce(a.ok, 0), coalesce(a.ok_minute, 0)
FROM bridge.subscriptions s LEFT JOIN a ON a.subscription_id = s.id`

const countStreamSQL = `
SELECT count(*) FROM bridge.deliveries d
WHERE d.subscription_id = $1 AND coalesce(d.asset_id, '') = $2 AND d.status IN ('pending', 'delivering')`

// listStreamSQL walks deliveries_open_by_stream: the head (in flight or next)
// first, then what waits behind it.
const listStreamSQL = `
SELECT d.id, d.seq, d.subscription_id::text, d.event_id, d.event_type, d.topic, d.asset_id, d.asset_seq,
       d.status, d.attempts, d.next_attempt_at, d.lease_expires_at, coalesce(d.claimed_by, ''), coalesce(d.last_error, ''),
       d.last_status_code, d.created_at, d.event_created_at, d.delivered_at, d.dead_at, d.revived_at
FROM bridge.deliveries d
WHERE d.subscription_id = $1 AND coalesce(d.asset_id, '') = $2 AND d.status IN ('pending', 'delivering')
ORDER BY d.seq
LIMIT $3`

const getTraceparentSQL = `SELECT coalesce(traceparent, '') FROM bridge.deliveries WHERE id = $1`

const insertTestDeliverySQL = `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, payload, event_created_at)
VALUES ($1, $2, $3, 'bridge.console', 'bridge.test', $4::jsonb, now())
RETURNING id`
