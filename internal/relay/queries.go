package relay

// Every SQL statement of the relay lives here, one named constant each.

// Lane leases ---------------------------------------------------------------

// heartbeatMemberSQL registers this replica (or extends its registration) so
// the others count it when they compute their fair share of lanes.
const heartbeatMemberSQL = `
INSERT INTO bridge.relay_members (member_id, hostname, expires_at)
VALUES ($1, $2, now() + $3::interval)
ON CONFLICT (member_id) DO UPDATE SET heartbeat_at = now(), expires_at = excluded.expires_at`

const liveMembersSQL = `SELECT count(*) FROM bridge.relay_members WHERE expires_at > now()`

const removeMemberSQL = `DELETE FROM bridge.relay_members WHERE member_id = $1`

const pruneMembersSQL = `DELETE FROM bridge.relay_members WHERE expires_at < now() - interval '1 hour'`

// renewLanesSQL extends the leases this replica still holds. A lease that
// already expired is not renewed: another replica may have taken the lane, and
// this replica must treat it as lost (it can re-acquire it as a free lane).
const renewLanesSQL = `
UPDATE bridge.relay_lanes SET expires_at = now() + $2::interval
WHERE owner = $1 AND expires_at > now()
RETURNING lane`

// acquireLanesSQL takes up to $3 free or expired lanes. SKIP LOCKED: two
// replicas acquiring at once take disjoint lanes instead of waiting on each
// other. epoch counts changes of owner (visible to operators).
const acquireLanesSQL = `
UPDATE bridge.relay_lanes l SET owner = $1, epoch = l.epoch + 1, expires_at = now() + $2::interval
WHERE l.lane IN (
  SELECT lane FROM bridge.relay_lanes
  WHERE owner IS NULL OR expires_at <= now()
  ORDER BY lane
  LIMIT $3
  FOR UPDATE SKIP LOCKED)
RETURNING l.lane`

// releaseLanesSQL gives lanes back (scale-out or graceful shutdown) so
// another replica takes them at once instead of after the lease timeout.
const releaseLanesSQL = `
UPDATE bridge.relay_lanes SET owner = NULL, expires_at = '-infinity'
WHERE owner = $1 AND lane = ANY($2::int[])`

// Claim and mark -------------------------------------------------------------

// claimSQL returns the next NEW rows of the lanes this replica holds, in seq
// order. No row lock is needed: a lane has one owner, and only the owner's
// single relay loop claims from it.
//
// The first NOT EXISTS is the per-asset hold (docs/failure-modes.md §3): asset X's row 5
// failed and waits for its retry; without the hold, the next claim would hand
// out X's row 6 and Kafka would see 6 before 5. A row whose earlier sibling
// waits is skipped; rows of every other asset still flow. A FAILED row is not
// NEW, so a parked row holds nothing back.
//
// $4 is a resume cursor. Marking rows SENT leaves dead entries in the NEW
// index until vacuum, and a scan from the lowest seq walks all of them: while
// draining a large backlog every claim would cost more than the one before.
// So while a drain is under way the claim resumes after the last seq it
// claimed. Rows at or below the cursor that are still NEW (a transaction that
// committed late, a row of a lane just taken over) are left for the next full
// scan (cursor 0), which runs whenever the relay catches up and at least once
// per poll interval. Their assets' later rows must wait for them: the relay
// checks every claimed asset's predecessor (predecessorsSQL) before producing.
const claimSQL = `
SELECT o.id, o.seq, o.asset_seq, o.topic, o.asset_id, o.lane, o.event_type, o.payload::text,
       o.headers, coalesce(o.traceparent, ''), coalesce(o.tracestate, ''), o.attempts,
       o.created_at, o.replayed_at IS NOT NULL
FROM bridge.outbox o
WHERE o.status = 'NEW'
  AND o.lane = ANY($1::int[])
  -- The lease, checked here and not only by the keeper's last tick: a
  -- replica whose renewals stalled must stop claiming a lane before its
  -- lease can lapse and another replica produce the same asset alongside it.
  AND o.lane IN (SELECT lane FROM bridge.relay_lanes WHERE owner = $5 AND expires_at > now() + $6::interval)
  AND o.seq > $4
  AND o.next_attempt_at <= now()
  AND o.seq <> ALL($3::bigint[]) -- the batch whose outcomes are being written
  AND NOT EXISTS (
    SELECT 1 FROM bridge.outbox e
    WHERE e.status = 'NEW'
      AND e.attempts > 0 -- only a charged row can be waiting; keeps the probe on a tiny index
      AND coalesce(e.asset_id, '') = coalesce(o.asset_id, '')
      AND e.seq < o.seq
      AND e.next_attempt_at > now())
ORDER BY o.seq
LIMIT $2`

// predecessorsSQL returns the status of the event just before the first
// claimed row of each asset (asset_seq is gapless, so "the one before" is a
// point lookup on the unique (asset, asset_seq) index, whatever the table's
// history). A NEW predecessor that is not part of this batch means an earlier
// event of the asset has not gone out yet: the asset's rows wait.
const predecessorsSQL = `
SELECT k.asset_key, o.status
FROM unnest($1::text[], $2::bigint[]) AS k(asset_key, asset_seq)
JOIN bridge.outbox o ON coalesce(o.asset_id, '') = k.asset_key AND o.asset_seq = k.asset_seq`

// fenceSQL is the lease check every mark statement carries: a replica that
// stalled past its lease (GC, network) may still see acks for records it
// produced, but it must not mark rows of a lane another replica now owns.
// The duplicate it produced is harmless (same dedup-id); a mark is not.

// markSentSQL records the broker's acknowledgement.
const markSentSQL = `
UPDATE bridge.outbox o
SET status = 'SENT', sent_at = now(), kafka_partition = m.part, kafka_offset = m.off, last_error = NULL
FROM unnest($2::uuid[], $3::int[], $4::bigint[]) AS m(id, part, off), bridge.relay_lanes l
WHERE o.id = m.id AND o.status = 'NEW'
  AND l.lane = o.lane AND l.owner = $1 AND l.expires_at > now()`

// chargeSQL counts a failed send that belongs to the row: attempts+1, the
// error, the next try after the backoff — or FAILED when the budget is spent,
// so the row stops holding back its asset.
const chargeSQL = `
UPDATE bridge.outbox o
SET attempts = o.attempts + 1,
    last_error = m.err,
    next_attempt_at = now() + m.delay_ms * interval '1 millisecond',
    status = CASE WHEN o.attempts + 1 >= $5 THEN 'FAILED' ELSE 'NEW' END,
    failed_at = CASE WHEN o.attempts + 1 >= $5 THEN now() END
FROM unnest($2::uuid[], $3::text[], $4::bigint[]) AS m(id, err, delay_ms), bridge.relay_lanes l
WHERE o.id = m.id AND o.status = 'NEW'
  AND l.lane = o.lane AND l.owner = $1 AND l.expires_at > now()
RETURNING o.id, o.status, o.attempts`

// parkSQL parks rows that retrying cannot fix (too large, invalid topic,
// authorization refused) at once, with the reason.
const parkSQL = `
UPDATE bridge.outbox o
SET status = 'FAILED', attempts = o.attempts + 1, last_error = m.err, failed_at = now()
FROM unnest($2::uuid[], $3::text[]) AS m(id, err), bridge.relay_lanes l
WHERE o.id = m.id AND o.status = 'NEW'
  AND l.lane = o.lane AND l.owner = $1 AND l.expires_at > now()`

// Maintenance ---------------------------------------------------------------

// deleteSentSQL removes SENT rows past retention in bounded batches, so the
// table (and the claim's index) stays small without one huge DELETE holding
// locks and bloating WAL.
const deleteSentSQL = `
DELETE FROM bridge.outbox
WHERE id IN (
  SELECT id FROM bridge.outbox
  WHERE status = 'SENT' AND sent_at < now() - $1::interval
  ORDER BY sent_at
  LIMIT $2)`

// Operator queries ------------------------------------------------------------

const statsByStatusSQL = `SELECT status, count(*) FROM bridge.outbox GROUP BY status`

const oldestNewSQL = `
SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM bridge.outbox WHERE status = 'NEW'`

const failedByTopicSQL = `
SELECT topic, count(*) FROM bridge.outbox WHERE status = 'FAILED' GROUP BY topic ORDER BY topic`

// listFailedSQL pages FAILED rows in seq order after seq $4 (0: from the
// start; a keyset cursor stays stable while rows are replayed or parked
// between two pages). The payload is read only when asked for ($3).
const listFailedSQL = `
SELECT id, seq, asset_seq, topic, asset_id, event_type, attempts, coalesce(last_error, ''), created_at, failed_at,
       CASE WHEN $3 THEN payload::text END
FROM bridge.outbox
WHERE status = 'FAILED' AND ($1 = '' OR topic = $1) AND seq > $4
ORDER BY seq
LIMIT $2`

// replayByIDSQL returns FAILED rows to NEW with a fresh budget. The row keeps
// its seq, so it goes out before any later row of its asset that is still NEW.
const replayByIDSQL = `
UPDATE bridge.outbox
SET status = 'NEW', attempts = 0, next_attempt_at = now(), failed_at = NULL, replayed_at = now()
WHERE status = 'FAILED' AND id = ANY($1::uuid[])`

const replayAllSQL = `
UPDATE bridge.outbox
SET status = 'NEW', attempts = 0, next_attempt_at = now(), failed_at = NULL, replayed_at = now()
WHERE status = 'FAILED' AND ($1 = '' OR topic = $1)
  AND ($2::interval IS NULL OR failed_at >= now() - $2::interval)`

// Benchmark fill ------------------------------------------------------------

// benchFillSQL writes $1 NEW rows for topic $2 spread over $3 assets with
// payloads of $4 bytes in one statement (the bench measures the relay, not
// enqueue). asset_seq continues each asset's counter, which is advanced to
// match, so the rows are exactly what bridge.enqueue would have written.
const benchFillSQL = `
WITH gen AS (
  SELECT g, 'bench-asset-' || (g % $3) AS asset
  FROM generate_series(1, $1::bigint) g
),
numbered AS (
  SELECT g, asset, row_number() OVER (PARTITION BY asset ORDER BY g) AS n FROM gen
),
per_asset AS (
  SELECT asset, count(*) AS cnt FROM gen GROUP BY asset
),
counters AS (
  INSERT INTO bridge.asset_counters AS c (asset_key, last_asset_seq)
  SELECT asset, cnt FROM per_asset
  ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = c.last_asset_seq + excluded.last_asset_seq
  RETURNING asset_key, last_asset_seq
)
INSERT INTO bridge.outbox (asset_seq, topic, asset_id, lane, event_type, payload)
SELECT c.last_asset_seq - p.cnt + n.n, $2, n.asset, bridge.lane_of(n.asset), 'bench.event',
       to_jsonb(repeat('x', greatest($4::int - 2, 0)))
FROM numbered n
JOIN counters c ON c.asset_key = n.asset
JOIN per_asset p ON p.asset = n.asset
ORDER BY n.g`

const benchCountNewSQL = `SELECT count(*) FROM bridge.outbox WHERE status = 'NEW' AND topic = $1`

const benchDeleteTopicSQL = `DELETE FROM bridge.outbox WHERE topic = $1`

const benchLatencySQL = `
SELECT id, extract(epoch FROM sent_at)::float8 FROM bridge.outbox WHERE id = ANY($1::uuid[]) AND status = 'SENT'`

// benchClaimMarkSQL is the machine's ceiling for the relay's bookkeeping: a
// batch of NEW rows claimed in seq order and marked SENT in one statement.
const benchClaimMarkSQL = `
WITH c AS (
  SELECT id FROM bridge.outbox
  WHERE status = 'NEW' AND topic = $1
  ORDER BY seq
  LIMIT $2
  FOR UPDATE SKIP LOCKED)
UPDATE bridge.outbox o
SET status = 'SENT', sent_at = now(), kafka_partition = 0, kafka_offset = 0
FROM c WHERE o.id = c.id`

// Console queries (inspect.go) ------------------------------------------------

// failedMatchingWhere is the one definition of FailedFilter ($1 topic, $2
// asset, $3 event type, $4 error substring, $5/$6 failed_at range; empty and
// NULL match everything). The error text is matched with strpos, not LIKE:
// an operator pasting an error containing % or _ means those characters.
const failedMatchingWhere = `
status = 'FAILED'
  AND ($1 = '' OR topic = $1)
  AND ($2 = '' OR coalesce(asset_id, '') = $2)
  AND ($3 = '' OR event_type = $3)
  AND ($4 = '' OR strpos(lower(coalesce(last_error, '')), lower($4)) > 0)
  AND ($5::timestamptz IS NULL OR failed_at >= $5)
  AND ($6::timestamptz IS NULL OR failed_at < $6)`

const listFailedMatchingSQL = `
SELECT id, seq, asset_seq, topic, asset_id, event_type, attempts, coalesce(last_error, ''), created_at, failed_at
FROM bridge.outbox
WHERE` + failedMatchingWhere + `
  AND seq > $8
ORDER BY seq
LIMIT $7`

const countFailedMatchingSQL = `SELECT count(*) FROM bridge.outbox WHERE` + failedMatchingWhere

const replayMatchingSQL = `
UPDATE bridge.outbox
SET status = 'NEW', attempts = 0, next_attempt_at = now(), failed_at = NULL, replayed_at = now()
WHERE` + failedMatchingWhere

const getRowSQL = `
SELECT id, seq, asset_seq, topic, asset_id, event_type, attempts, coalesce(last_error, ''), created_at, failed_at,
       CASE WHEN $2 THEN payload::text END, status, headers, coalesce(traceparent, ''),
       sent_at, replayed_at, kafka_partition, kafka_offset
FROM bridge.outbox WHERE id = $1`

const topicStatsSQL = `
SELECT topic,
       count(*) FILTER (WHERE status = 'NEW'),
       count(*) FILTER (WHERE status = 'SENT'),
       count(*) FILTER (WHERE status = 'FAILED'),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'NEW')), 0)::float8
FROM bridge.outbox
GROUP BY topic
ORDER BY topic`

// throughputSQL reads the window's SENT rows on outbox_sent_at.
const throughputSQL = `
SELECT count(*),
       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM sent_at - created_at)), 0)::float8,
       coalesce(percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM sent_at - created_at)), 0)::float8
FROM bridge.outbox
WHERE status = 'SENT' AND sent_at > now() - $1::interval`
