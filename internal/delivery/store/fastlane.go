package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxbridge/bridge/internal/database/statement"
)

// What the fast lane (internal/delivery/fastlane) writes and reads: the
// park markers of bridge.delivery_parks, the rows it hands to the slow lane,
// and its append-only attempt log bridge.webhook_attempts. The hand-over
// protocol is in migrations/00220_delivery_parks.sql and
// docs/architecture.md.

// fastRoutesSQL is every subscription as the fast lane needs it: its routing
// rule, where to post and the secrets that sign now (newest first).
//
// rate_limit > 0 makes the fast lane park every stream of the subscription
// on sight (the slow lane serves it). A subscription whose history
// (create --since) is still being copied reports 1 when it has no limit:
// its live events must queue behind its history, which the slow lane holds
// back until the copy is done; sent from the fast lane they would go out
// before older events of their asset. Once the copy is done its streams
// come back to the fast lane as any parked stream does.
const fastRoutesSQL = `
SELECT c.id::text AS id, c.enabled, c.event_types, coalesce(c.topic, '') AS topic, c.url,
       CASE WHEN c.history_since IS NOT NULL AND c.history_done_at IS NULL THEN greatest(coalesce(c.rate_limit, 0), 1)
            ELSE coalesce(c.rate_limit, 0) END AS rate_limit,
       ARRAY(SELECT k.secret FROM bridge.subscription_secrets k
             WHERE k.subscription_id = c.id AND (k.expires_at IS NULL OR k.expires_at > now())
             ORDER BY k.id DESC) AS secrets
FROM bridge.subscriptions c`

// FastRoute is a subscription as the fast lane sees it.
type FastRoute struct {
	ID         string   `db:"id"`
	Enabled    bool     `db:"enabled"`
	EventTypes []string `db:"event_types"`
	Topic      string   `db:"topic"`
	URL        string   `db:"url"`
	RateLimit  int      `db:"rate_limit"`
	Secrets    []string `db:"secrets"`
	// SecretsErr is why Secrets could not be opened (see Claim.SecretsErr).
	SecretsErr error `db:"-"`
}

// RoutesVersion is bridge.subscriptions_version's number and the snapshot's
// now() (migrations/00310_subscriptions_version.sql). A version equal to the
// one FastRoutesAt returned means the routes read then are still those of
// this snapshot.
type RoutesVersion struct {
	Version int64     `db:"version"`
	AsOf    time.Time `db:"as_of"`
}

// routesVersionSQL is the fast lane's cheap check: one row of a one-row
// table. now() is the statement's start, before its snapshot is taken, so
// the snapshot holds every subscription change committed before AsOf.
const routesVersionSQL = `SELECT version, now() AS as_of FROM bridge.subscriptions_version`

// CheckRoutes reads the subscriptions' version and the snapshot's now().
func (s *DeliveryStore) CheckRoutes(ctx context.Context) (RoutesVersion, error) {
	v, err := statement.Select[RoutesVersion](ctx, s.db, "check the subscriptions' version", routesVersionSQL)
	if err != nil {
		return RoutesVersion{}, err
	}
	if len(v) != 1 {
		return RoutesVersion{}, fmt.Errorf("check the subscriptions' version: %d rows in bridge.subscriptions_version, want 1", len(v))
	}
	return v[0], nil
}

// FastRoutesAt reads every subscription (as FastRoutes) and the version in
// one REPEATABLE READ snapshot; AsOf is the transaction's now(), taken
// before that snapshot, so the routes hold every change committed before
// it.
func (s *DeliveryStore) FastRoutesAt(ctx context.Context) ([]FastRoute, RoutesVersion, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, RoutesVersion{}, fmt.Errorf("load subscriptions for the fast lane: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only; ends the transaction
	if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`); err != nil {
		return nil, RoutesVersion{}, fmt.Errorf("load subscriptions for the fast lane: %w", err)
	}
	v, err := statement.Select[RoutesVersion](ctx, tx, "check the subscriptions' version", routesVersionSQL)
	if err != nil {
		return nil, RoutesVersion{}, err
	}
	if len(v) != 1 {
		return nil, RoutesVersion{}, fmt.Errorf("load subscriptions for the fast lane: %d rows in bridge.subscriptions_version, want 1", len(v))
	}
	rs, err := statement.Select[FastRoute](ctx, tx, "load subscriptions for the fast lane", fastRoutesSQL)
	if err != nil {
		return nil, RoutesVersion{}, err
	}
	for i := range rs {
		open, err := openSecrets(s.keys, rs[i].ID, rs[i].Secrets)
		rs[i].Secrets, rs[i].SecretsErr = open, err
	}
	return rs, v[0], tx.Commit(ctx)
}

// Stream names a (subscription, asset) stream; AssetKey is coalesce(asset_id,
// ”).
type Stream struct {
	SubscriptionID string `db:"subscription_id"`
	AssetKey       string `db:"asset_key"`
}

func compareStreams(a, b Stream) int {
	return cmp.Or(strings.Compare(a.SubscriptionID, b.SubscriptionID), strings.Compare(a.AssetKey, b.AssetKey))
}

const parksSQL = `SELECT subscription_id::text AS subscription_id, asset_key FROM bridge.delivery_parks`

// Parks returns every parked stream. The fast lane reads them when it is
// assigned partitions, before the first record, and again every few seconds
// to learn of parks other writers made (revive, recover, history).
func (s *DeliveryStore) Parks(ctx context.Context) ([]Stream, error) {
	return statement.Select[Stream](ctx, s.db, "load park markers", parksSQL)
}

// Marker is a new park: the stream and the record it was parked at.
type Marker struct {
	Stream
	Topic     string
	Partition int32
	Offset    int64
}

// Parked is one delivery handed to the slow lane. Attempts is what the fast
// lane already spent on it (1 for the head whose attempt failed, else 0);
// such a row waits RetryIn and carries the attempt's status and error. A row
// behind that head in the same hand-over waits the same RetryIn (it is not
// due before the head; see insertParkedSQL for rows appended later).
type Parked struct {
	SubscriptionID string
	Event          Event
	Attempts       int
	RetryIn        time.Duration
	StatusCode     int
	Error          string
}

// upsertMarkersSQL writes new parks in (subscription, asset) order (the order
// every writer takes marker rows in) and holds their row locks to COMMIT.
// A subscription deleted since the fast lane read its routes gets no marker:
// its foreign key would fail the whole hand-over, again at every retry.
const upsertMarkersSQL = `
INSERT INTO bridge.delivery_parks AS p (subscription_id, asset_key, topic, kafka_partition, kafka_offset)
SELECT m.* FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::bigint[])
  AS m(subscription_id, asset_key, topic, kafka_partition, kafka_offset)
WHERE EXISTS (SELECT 1 FROM bridge.subscriptions s WHERE s.id = m.subscription_id)
ORDER BY m.subscription_id, m.asset_key
ON CONFLICT (subscription_id, asset_key) DO UPDATE
  SET kafka_partition = excluded.kafka_partition, kafka_offset = excluded.kafka_offset`

// lockMarkersSQL locks the markers of streams the fast lane holds parked and
// returns those that still exist; one the slow lane deleted is not returned:
// that stream is back in the fast lane.
const lockMarkersSQL = `
SELECT p.subscription_id::text AS subscription_id, p.asset_key
FROM bridge.delivery_parks p
WHERE (p.subscription_id, p.asset_key) IN (SELECT * FROM unnest($1::uuid[], $2::text[]))
ORDER BY p.subscription_id, p.asset_key
FOR UPDATE OF p`

// insertParkedSQL writes handed-over deliveries in array order (their seq
// follows it: the stream's partition order).
//
// Only for subscriptions that exist and are enabled when the hand-over
// commits: a disabled subscription gets nothing queued while it is disabled
// (the rule of the row engine's consumer), including what the fast lane
// routed to it with routes read before the disable — the announcement of
// its own disable, routed to it, would otherwise wait as a pending row for
// as long as it stays disabled. A deleted one's rows would fail the foreign
// key.
//
// A delivery appended behind its stream's pending head (attempts 0) is not
// due before that head: it takes the head's next_attempt_at when that is
// later than its own. Inserted due now, it made the stream ready now
// (delivery_streams_on_insert takes the least next_attempt_at), while the
// head waited for its retry: every hand-over to a parked stream then cost a
// claim that found the head not due and parked the stream again (an update
// of its stream row) — for a failing subscription, one wasted claim per
// stream per hand-over, on the cores the healthy subscriptions' deliveries
// use. The order is the same either way (a row is only claimed as its
// stream's head), and once the head is done the row is due: its time is at
// most the head's. A head in flight ('delivering') is not waited for: its
// answer may come at once.
const insertParkedSQL = `
WITH r AS (
  SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[],
              $8::timestamptz[], $9::text[], $10::text[], $11::int[], $12::bigint[], $13::int[], $14::text[])
    WITH ORDINALITY AS r(subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload,
                         event_created_at, traceparent, tracestate, attempts, retry_us, status_code, error, ord)
), heads AS (
  SELECT k.subscription_id, k.asset_key, h.next_attempt_at
  FROM (SELECT DISTINCT r.subscription_id, coalesce(r.asset_id, '') AS asset_key FROM r WHERE r.attempts = 0) k
  CROSS JOIN LATERAL (
    SELECT CASE WHEN d.status = 'pending' THEN d.next_attempt_at END AS next_attempt_at FROM bridge.deliveries d
    WHERE d.subscription_id = k.subscription_id AND coalesce(d.asset_id, '') = k.asset_key
      AND d.status IN ('pending', 'delivering')
    ORDER BY d.seq LIMIT 1) h
)
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq,
                               payload, event_created_at, traceparent, tracestate,
                               attempts, next_attempt_at, last_status_code, last_error)
SELECT r.subscription_id, r.event_id, r.event_type, r.topic, r.asset_id, r.asset_seq,
       r.payload::jsonb, r.event_created_at, r.traceparent, r.tracestate,
       r.attempts,
       CASE WHEN r.attempts = 0 THEN greatest(now() + r.retry_us * interval '1 microsecond', h.next_attempt_at)
            ELSE now() + r.retry_us * interval '1 microsecond' END,
       r.status_code, nullif(r.error, '')
FROM r LEFT JOIN heads h ON h.subscription_id = r.subscription_id AND h.asset_key = coalesce(r.asset_id, '')
WHERE EXISTS (SELECT 1 FROM bridge.subscriptions s WHERE s.id = r.subscription_id AND s.enabled)
ORDER BY r.ord
ON CONFLICT (subscription_id, event_id) DO NOTHING`

// HandOver writes, in one transaction, the new parks (markers) and the
// deliveries of streams handed to the slow lane. rows holds the deliveries
// of the new parks and of the streams in appends (streams the caller holds
// parked), each stream's in its order; a row of a stream in appends whose
// marker no longer exists is not written, and that stream is returned in
// unparked: the slow lane emptied it, and its rows go back to the fast lane.
// The marker locks make the hand-over exact: a settle of the stream's last
// row either committed before (the marker is gone) or leaves the marker,
// whose stream now has these rows (see the migration).
func (s *DeliveryStore) HandOver(ctx context.Context, markers []Marker, appends []Stream, rows []Parked) (unparked []Stream, err error) {
	markers = slices.Clone(markers)
	slices.SortFunc(markers, func(a, b Marker) int { return compareStreams(a.Stream, b.Stream) })
	appends = slices.Clone(appends)
	slices.SortFunc(appends, compareStreams)
	appends = slices.CompactFunc(appends, func(a, b Stream) bool { return a == b })
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("hand over to the slow lane: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	keep := make(map[Stream]bool, len(markers)+len(appends))
	if len(markers) > 0 {
		n := len(markers)
		subs, assets, topics := make([]string, n), make([]string, n), make([]string, n)
		parts, offs := make([]int32, n), make([]int64, n)
		for i, m := range markers {
			subs[i], assets[i], topics[i], parts[i], offs[i] = m.SubscriptionID, m.AssetKey, m.Topic, m.Partition, m.Offset
			keep[m.Stream] = true
		}
		if _, err := tx.Exec(ctx, upsertMarkersSQL, subs, assets, topics, parts, offs); err != nil {
			return nil, fmt.Errorf("hand over to the slow lane: write park markers: %w", err)
		}
	}
	if len(appends) > 0 {
		subs, assets := make([]string, len(appends)), make([]string, len(appends))
		for i, a := range appends {
			subs[i], assets[i] = a.SubscriptionID, a.AssetKey
		}
		present, err := statement.Select[Stream](ctx, tx, "lock park markers", lockMarkersSQL, subs, assets)
		if err != nil {
			return nil, fmt.Errorf("hand over to the slow lane: %w", err)
		}
		for _, p := range present {
			keep[p] = true
		}
		for _, a := range appends {
			if !keep[a] {
				unparked = append(unparked, a)
			}
		}
	}
	var a parkedArrays
	for _, r := range rows {
		key := Stream{SubscriptionID: r.SubscriptionID, AssetKey: deref(r.Event.AssetID)}
		if keep[key] {
			a.add(r)
		}
	}
	if len(a.sub) > 0 {
		if _, err := tx.Exec(ctx, insertParkedSQL, a.sub, a.id, a.typ, a.topic, a.asset, a.assetSeq, a.payload,
			a.created, a.tp, a.ts, a.attempts, a.retryUS, a.status, a.err); err != nil {
			return nil, fmt.Errorf("hand over to the slow lane: insert deliveries: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("hand over to the slow lane: commit: %w", err)
	}
	return unparked, nil
}

type parkedArrays struct {
	sub, id, typ, topic, payload []string
	asset, tp, ts                []*string
	assetSeq                     []*int64
	created                      []time.Time
	attempts                     []int32
	retryUS                      []int64
	status                       []*int32
	err                          []string
}

func (a *parkedArrays) add(r Parked) {
	a.sub = append(a.sub, r.SubscriptionID)
	a.id = append(a.id, r.Event.ID)
	a.typ = append(a.typ, r.Event.Type)
	a.topic = append(a.topic, r.Event.Topic)
	a.payload = append(a.payload, r.Event.Payload)
	a.asset = append(a.asset, r.Event.AssetID)
	a.tp = append(a.tp, nullable(r.Event.Traceparent))
	a.ts = append(a.ts, nullable(r.Event.Tracestate))
	a.assetSeq = append(a.assetSeq, r.Event.AssetSeq)
	a.created = append(a.created, r.Event.CreatedAt)
	a.attempts = append(a.attempts, int32(r.Attempts))
	a.retryUS = append(a.retryUS, r.RetryIn.Microseconds())
	a.status = append(a.status, statusArg(r.StatusCode))
	a.err = append(a.err, r.Error)
}

// sweepCandidatesSQL locks markers that no transaction holds; sweepParksSQL
// then deletes those whose stream has no open row. Two statements on
// purpose: the second runs on a snapshot taken after the locks, so it sees
// every row an appender committed before letting go of a marker.
const sweepCandidatesSQL = `
SELECT p.subscription_id::text AS subscription_id, p.asset_key
FROM bridge.delivery_parks p
ORDER BY p.subscription_id, p.asset_key
LIMIT $1
FOR UPDATE OF p SKIP LOCKED`

const sweepParksSQL = `
DELETE FROM bridge.delivery_parks p
USING unnest($1::uuid[], $2::text[]) AS c(subscription_id, asset_key)
WHERE p.subscription_id = c.subscription_id AND p.asset_key = c.asset_key
  AND NOT EXISTS (SELECT 1 FROM bridge.deliveries d
                  WHERE d.subscription_id = p.subscription_id AND coalesce(d.asset_id, '') = p.asset_key
                    AND d.status IN ('pending', 'delivering'))`

// SweepParks deletes up to limit markers left without an open row (an
// appender that rolled back after the stream's last settle skipped it), so
// their streams return to the fast lane.
func (s *DeliveryStore) SweepParks(ctx context.Context, limit int) (int, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("sweep park markers: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	cands, err := statement.Select[Stream](ctx, tx, "sweep park markers", sweepCandidatesSQL, limit)
	if err != nil || len(cands) == 0 {
		return 0, err
	}
	subs, assets := make([]string, len(cands)), make([]string, len(cands))
	for i, c := range cands {
		subs[i], assets[i] = c.SubscriptionID, c.AssetKey
	}
	tag, err := tx.Exec(ctx, sweepParksSQL, subs, assets)
	if err != nil {
		return 0, fmt.Errorf("sweep park markers: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("sweep park markers: commit: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Until the fast lane first starts, no writer of bridge.deliveries writes a
// park marker (migrations/00300_delivery_parks_gate.sql): the markers serve
// the fast lane only, and on the default path they cost a marker write, a
// row lock and a delete per delivery. EnableParks turns them on, once and
// for good: under the gate's exclusive advisory lock (every writer that
// read the gate off holds it shared to COMMIT) it sets the gate and parks
// every stream that has an open row. The park runs after the lock, so its
// snapshot sees every row written without a marker; a writer that comes
// after reads the gate on. Called at the fast lane's start, before it reads
// any marker.
const (
	parksGateSQL       = `SELECT parks_since IS NOT NULL FROM bridge.delivery_parks_gate`
	parksGateLockSQL   = `SELECT pg_advisory_xact_lock(7411008)`
	parksGateOpenSQL   = `UPDATE bridge.delivery_parks_gate SET parks_since = now() WHERE parks_since IS NULL`
	parkOpenStreamsSQL = `
INSERT INTO bridge.delivery_parks (subscription_id, asset_key, topic)
SELECT d.subscription_id, coalesce(d.asset_id, ''), min(d.topic)
FROM bridge.deliveries d
WHERE d.status IN ('pending', 'delivering')
GROUP BY 1, 2
ORDER BY 1, 2
ON CONFLICT DO NOTHING`
)

// EnableParks turns the park markers on (the rule is above parksGateSQL)
// and reports how many streams it parked; 0 when they were on already.
func (s *DeliveryStore) EnableParks(ctx context.Context) (int, error) {
	var on bool
	if err := s.db.QueryRow(ctx, parksGateSQL).Scan(&on); err != nil {
		return 0, fmt.Errorf("read the park markers' gate: %w", err)
	}
	if on {
		return 0, nil
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("turn the park markers on: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	if _, err := tx.Exec(ctx, parksGateLockSQL); err != nil {
		return 0, fmt.Errorf("turn the park markers on: lock: %w", err)
	}
	tag, err := tx.Exec(ctx, parksGateOpenSQL)
	if err != nil {
		return 0, fmt.Errorf("turn the park markers on: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return 0, nil // another member did it first
	}
	tag, err = tx.Exec(ctx, parkOpenStreamsSQL)
	if err != nil {
		return 0, fmt.Errorf("turn the park markers on: park the open streams: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("turn the park markers on: commit: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// FastAttempt is one HTTP attempt of the fast lane. Never the payload.
type FastAttempt struct {
	SubscriptionID string
	EventID        string
	EventType      string
	Topic          string
	Partition      int32
	Offset         int64
	AssetID        *string
	Attempt        int
	Outcome        Outcome
}

// fastAttemptColumns are the columns of bridge.webhook_attempts the fast
// lane's COPY fills (the rest take their defaults).
var fastAttemptColumns = []string{"subscription_id", "event_id", "event_type", "topic", "kafka_partition", "kafka_offset",
	"asset_id", "attempt", "started_at", "duration_ms", "status_code", "error", "response_body", "trace_id"}

// forgiveSQL: a success resets its subscription's count of consecutive
// deaths. It writes only rows whose count is not already 0, so a healthy
// subscription's row is not rewritten per flush.
const forgiveSQL = `
UPDATE bridge.subscriptions s SET consecutive_failures = 0, updated_at = now()
WHERE s.id IN (SELECT x.id FROM bridge.subscriptions x
               WHERE x.id = ANY($1::uuid[]) AND x.consecutive_failures <> 0
               ORDER BY x.id FOR UPDATE OF x)`

// LogFastAttempts appends attempts to bridge.webhook_attempts with one COPY
// (no UPDATE or DELETE ever: retention drops partitions) and forgives the
// subscriptions that had a success, in one transaction. COPY rather than a
// multi-row INSERT of arrays: building a dozen arrays per flush was the
// fast lane's largest allocation per delivery. It commits without waiting
// for the WAL flush: a database crash can lose the last fraction of a
// second of the log, never a delivery (the offsets, not this log, say what
// is done).
func (s *DeliveryStore) LogFastAttempts(ctx context.Context, as []FastAttempt, forgive []string) error {
	if len(as) == 0 && len(forgive) == 0 {
		return nil
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("log fast-lane attempts: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
		return fmt.Errorf("log fast-lane attempts: %w", err)
	}
	if len(as) > 0 {
		row := make([]any, len(fastAttemptColumns))
		subs := map[string]any{}
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"bridge", "webhook_attempts"}, fastAttemptColumns,
			pgx.CopyFromSlice(len(as), func(i int) ([]any, error) {
				a := &as[i]
				o := &a.Outcome
				// The subscription id goes as the uuid's 16 bytes, parsed
				// once per subscription and flush: given as a string, pgx
				// failed to encode it as binary (building an error) on
				// every row before parsing it.
				sub, ok := subs[a.SubscriptionID]
				if !ok {
					sub = a.SubscriptionID // not a uuid: PostgreSQL says why
					if u, err := uuid.Parse(a.SubscriptionID); err == nil {
						sub = pgtype.UUID{Bytes: u, Valid: true}
					}
					subs[a.SubscriptionID] = sub
				}
				row[0], row[1], row[2], row[3] = sub, a.EventID, a.EventType, a.Topic
				row[4], row[5], row[6], row[7] = a.Partition, a.Offset, a.AssetID, int32(a.Attempt)
				row[8], row[9], row[10] = o.StartedAt, float64(o.Duration.Microseconds())/1000, statusArg(o.StatusCode)
				row[11], row[12], row[13] = nullable(o.Error), nullable(o.ResponseBody), nullable(o.TraceID)
				return row, nil
			}))
		if err != nil {
			return fmt.Errorf("log fast-lane attempts: %w", err)
		}
	}
	if len(forgive) > 0 {
		if _, err := tx.Exec(ctx, forgiveSQL, forgive); err != nil {
			return fmt.Errorf("log fast-lane attempts: forgive: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("log fast-lane attempts: %w", err)
	}
	return nil
}

// attemptPartitionName is the day partition of bridge.webhook_attempts
// holding day (UTC).
func attemptPartitionName(day time.Time) string {
	return "webhook_attempts_" + day.UTC().Format("20060102")
}

// attemptPartitionsLock serialises partition maintenance across replicas
// (two CREATE … PARTITION OF for the same day would conflict).
const attemptPartitionsLock = `SELECT pg_advisory_xact_lock(7411006)`

// EnsureAttemptPartitions creates the day partitions of bridge.webhook_attempts
// from yesterday to days ahead of now (UTC) that do not exist yet.
func (s *DeliveryStore) EnsureAttemptPartitions(ctx context.Context, now time.Time, ahead int) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("create attempt log partitions: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	if _, err := tx.Exec(ctx, attemptPartitionsLock); err != nil {
		return fmt.Errorf("create attempt log partitions: %w", err)
	}
	today := now.UTC().Truncate(24 * time.Hour)
	for d := -1; d <= ahead; d++ {
		day := today.AddDate(0, 0, d)
		sql := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS bridge.%s PARTITION OF bridge.webhook_attempts FOR VALUES FROM ('%s') TO ('%s')`,
			attemptPartitionName(day), day.Format(time.RFC3339), day.AddDate(0, 0, 1).Format(time.RFC3339))
		if _, err := tx.Exec(ctx, sql); err != nil {
			return fmt.Errorf("create attempt log partition %s: %w", attemptPartitionName(day), err)
		}
	}
	return tx.Commit(ctx)
}

const attemptPartitionsSQL = `
SELECT c.relname FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'bridge.webhook_attempts'::regclass`

// DropAttemptPartitions drops the day partitions of bridge.webhook_attempts
// that end before cutoff: retention without a DELETE. It returns their
// names.
func (s *DeliveryStore) DropAttemptPartitions(ctx context.Context, cutoff time.Time) ([]string, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("drop attempt log partitions: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	if _, err := tx.Exec(ctx, attemptPartitionsLock); err != nil {
		return nil, fmt.Errorf("drop attempt log partitions: %w", err)
	}
	rows, err := tx.Query(ctx, attemptPartitionsSQL)
	if err != nil {
		return nil, fmt.Errorf("list attempt log partitions: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list attempt log partitions: %w", err)
	}
	var dropped []string
	for _, name := range names {
		day, err := time.Parse("20060102", strings.TrimPrefix(name, "webhook_attempts_"))
		if err != nil || day.AddDate(0, 0, 1).After(cutoff) {
			continue
		}
		if _, err := tx.Exec(ctx, "DROP TABLE bridge."+pgx.Identifier{name}.Sanitize()); err != nil {
			return nil, fmt.Errorf("drop attempt log partition %s: %w", name, err)
		}
		dropped = append(dropped, name)
	}
	return dropped, tx.Commit(ctx)
}
