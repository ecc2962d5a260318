package outboxstore

import (
	"context"
	"fmt"
)

// Statements of the relay benchmark (internal/bench/relaybench), which runs
// in a scratch database on a topic of its own.

// benchFillSQL writes $1 events for topic $2 spread over $3 assets with
// payloads of $4 bytes into the log's current table in one statement (the
// bench measures the relay, not enqueue). asset_seq continues each asset's
// numbering as bridge.enqueue reads it (the newer of its counter and its
// newest log row), so the rows are exactly what bridge.enqueue would have
// written.
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
           (SELECT max(o.asset_seq) FROM bridge.outbox_log o WHERE coalesce(o.asset_id, '') = p.asset), 0) + p.cnt
  FROM per_asset p ORDER BY p.asset
  ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = excluded.last_asset_seq
  RETURNING asset_key, last_asset_seq
),
cur AS (SELECT tbl FROM bridge.outbox_log_tables WHERE current)
INSERT INTO bridge.outbox_log (tbl, id, asset_seq, topic, asset_id, lane, event_type, payload)
SELECT cur.tbl, bridge.outbox_log_id(cur.tbl), c.last_asset_seq - p.cnt + n.n, $2, n.asset, bridge.lane_of(n.asset),
       'bench.event', to_jsonb(repeat('x', greatest($4::int - 2, 0)))
FROM numbered n
JOIN counters c ON c.asset_key = n.asset
JOIN per_asset p ON p.asset = n.asset
CROSS JOIN cur
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

// The claim+mark ceiling runs on a table of rows with a send status, the
// shape the outbox had before it became a log (bench_outbox_rows, created by
// the bench in its scratch database): a batch of NEW rows claimed in seq
// order and marked SENT in one statement, the fastest a claim-and-mark relay
// can go on this machine.
const benchRowTableSQL = `
CREATE TABLE IF NOT EXISTS public.bench_outbox_rows (
  id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  seq             bigint GENERATED ALWAYS AS IDENTITY,
  asset_seq       bigint NOT NULL,
  topic           text NOT NULL,
  asset_id        text,
  lane            int NOT NULL,
  event_type      text NOT NULL,
  payload         jsonb NOT NULL,
  headers         jsonb NOT NULL DEFAULT '{}'::jsonb,
  status          text NOT NULL DEFAULT 'NEW',
  attempts        int NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  created_at      timestamptz NOT NULL DEFAULT now(),
  sent_at         timestamptz,
  kafka_partition int,
  kafka_offset    bigint
);
CREATE UNIQUE INDEX IF NOT EXISTS bench_outbox_rows_asset_seq ON public.bench_outbox_rows ((coalesce(asset_id, '')), asset_seq);
CREATE INDEX IF NOT EXISTS bench_outbox_rows_new_by_seq ON public.bench_outbox_rows (seq) INCLUDE (lane, next_attempt_at) WHERE status = 'NEW';
ALTER TABLE public.bench_outbox_rows SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
  autovacuum_analyze_scale_factor = 0.02)`

const benchRowFillSQL = `
INSERT INTO public.bench_outbox_rows (asset_seq, topic, asset_id, lane, event_type, payload)
SELECT row_number() OVER (PARTITION BY g % $3 ORDER BY g), $2, 'bench-asset-' || (g % $3), bridge.lane_of('bench-asset-' || (g % $3)),
       'bench.event', to_jsonb(repeat('x', greatest($4::int - 2, 0)))
FROM generate_series(1, $1::bigint) g
ORDER BY g`

// BenchFillRowTable creates the row table (see benchRowTableSQL) and fills
// it with n NEW rows for topic, then analyzes it.
func BenchFillRowTable(ctx context.Context, db DB, n int, topic string, assets, payloadBytes int) error {
	if _, err := db.Exec(ctx, benchRowTableSQL); err != nil {
		return fmt.Errorf("create the claim+mark row table: %w", err)
	}
	if _, err := db.Exec(ctx, benchRowFillSQL, n, topic, assets, payloadBytes); err != nil {
		return fmt.Errorf("fill the claim+mark row table: %w", err)
	}
	if _, err := db.Exec(ctx, `ANALYZE public.bench_outbox_rows`); err != nil {
		return fmt.Errorf("analyze the claim+mark row table: %w", err)
	}
	return nil
}

// BenchDropRowTable drops the row table.
func BenchDropRowTable(ctx context.Context, db DB) error {
	_, err := db.Exec(ctx, `DROP TABLE IF EXISTS public.bench_outbox_rows`)
	return err
}

const benchClaimMarkSQL = `
WITH c AS (
  SELECT id FROM public.bench_outbox_rows
  WHERE status = 'NEW' AND topic = $1
  ORDER BY seq
  LIMIT $2
  FOR UPDATE SKIP LOCKED)
UPDATE public.bench_outbox_rows o
SET status = 'SENT', sent_at = now(), kafka_partition = 0, kafka_offset = 0
FROM c WHERE o.id = c.id`

// BenchClaimMark claims and marks up to batch NEW rows of topic in the row
// table in one statement and returns how many.
func BenchClaimMark(ctx context.Context, db DB, topic string, batch int) (int64, error) {
	tag, err := db.Exec(ctx, benchClaimMarkSQL, topic, batch)
	if err != nil {
		return 0, fmt.Errorf("claim+mark ceiling: %w", err)
	}
	return tag.RowsAffected(), nil
}

// BenchEmptyLog empties the log and the held rows whole (a benchmark's
// scratch database only: between its ceilings and its drain).
func BenchEmptyLog(ctx context.Context, db DB) error {
	if _, err := db.Exec(ctx, `TRUNCATE bridge.outbox_log, bridge.outbox_held`); err != nil {
		return fmt.Errorf("empty the outbox log: %w", err)
	}
	return nil
}

// BenchAnalyze refreshes the planner statistics of the log and the held rows.
func BenchAnalyze(ctx context.Context, db DB) error {
	if _, err := db.Exec(ctx, `ANALYZE bridge.outbox_log, bridge.outbox_held`); err != nil {
		return fmt.Errorf("analyze the outbox log: %w", err)
	}
	return nil
}
