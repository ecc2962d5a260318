package outboxstore

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Statements of the relay benchmark (internal/bench/relaybench), which runs
// in a scratch database on a topic of its own.

// benchFillSQL writes $1 NEW rows for topic $2 spread over $3 assets with
// payloads of $4 bytes in one statement (the bench measures the relay, not
// enqueue). asset_seq continues each asset's numbering as bridge.enqueue
// reads it (the newer of its counter and its newest outbox row, migration
// 00130), so the rows are exactly what bridge.enqueue would have written.
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
  SELECT p.asset, greatest(
           (SELECT k.last_asset_seq FROM bridge.asset_counters k WHERE k.asset_key = p.asset),
           (SELECT max(o.asset_seq) FROM bridge.outbox o WHERE coalesce(o.asset_id, '') = p.asset), 0) + p.cnt
  FROM per_asset p ORDER BY p.asset
  ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = excluded.last_asset_seq
  RETURNING asset_key, last_asset_seq
)
INSERT INTO bridge.outbox (asset_seq, topic, asset_id, lane, event_type, payload)
SELECT c.last_asset_seq - p.cnt + n.n, $2, n.asset, bridge.lane_of(n.asset), 'bench.event',
       to_jsonb(repeat('x', greatest($4::int - 2, 0)))
FROM numbered n
JOIN counters c ON c.asset_key = n.asset
JOIN per_asset p ON p.asset = n.asset
ORDER BY n.g`

// BenchFill writes n NEW rows for topic over assets assets with payloads of
// payloadBytes bytes (a JSON string).
func BenchFill(ctx context.Context, db DB, n int, topic string, assets, payloadBytes int) error {
	if _, err := db.Exec(ctx, benchFillSQL, n, topic, assets, payloadBytes); err != nil {
		return fmt.Errorf("fill outbox: %w", err)
	}
	return nil
}

const benchCountNewSQL = `SELECT count(*) FROM bridge.outbox WHERE status = 'NEW' AND topic = $1`

// BenchCountNew counts topic's NEW rows (a full scan: call it rarely).
func BenchCountNew(ctx context.Context, db DB, topic string) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, benchCountNewSQL, topic).Scan(&n); err != nil {
		return 0, fmt.Errorf("count NEW rows: %w", err)
	}
	return n, nil
}

const benchSentAtSQL = `
SELECT id, extract(epoch FROM sent_at)::float8 FROM bridge.outbox WHERE id = ANY($1::uuid[]) AND status = 'SENT'`

// BenchSentAt returns when each of the given rows was marked SENT.
func BenchSentAt(ctx context.Context, db DB, ids []uuid.UUID) (map[uuid.UUID]time.Time, error) {
	rows, err := db.Query(ctx, benchSentAtSQL, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[uuid.UUID]time.Time{}
	for rows.Next() {
		var id uuid.UUID
		var sent float64
		if err := rows.Scan(&id, &sent); err != nil {
			return nil, err
		}
		out[id] = time.Unix(0, int64(sent*1e9))
	}
	return out, rows.Err()
}

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

// BenchClaimMark claims and marks up to batch NEW rows of topic in one
// statement and returns how many.
func BenchClaimMark(ctx context.Context, db DB, topic string, batch int) (int64, error) {
	tag, err := db.Exec(ctx, benchClaimMarkSQL, topic, batch)
	if err != nil {
		return 0, fmt.Errorf("claim+mark ceiling: %w", err)
	}
	return tag.RowsAffected(), nil
}
