package store

import (
	"context"
	"testing"
	"time"
)

// BenchmarkClaim measures one claim of up to 32 deliveries over a backlog of
// 10 subscriptions × 100 assets × 20 pending events (20,000 rows), releasing
// the claims after each so the backlog stays the same size.
func BenchmarkClaim(b *testing.B) {
	tb := setupB(b)
	ctx := context.Background()
	var subIDs []string
	for range 10 {
		var id string
		if err := tb.pool.QueryRow(ctx, `INSERT INTO bridge.subscriptions (url, event_types) VALUES ('https://x.example/', '{*}') RETURNING id::text`).Scan(&id); err != nil {
			b.Fatal(err)
		}
		subIDs = append(subIDs, id)
	}
	if _, err := tb.pool.Exec(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at)
SELECT s, 'e-' || g || '-' || s, 't', 'bench', 'asset-' || (g % 100), g / 100, '{"pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}', now()
FROM unnest($1::uuid[]) s, generate_series(0, 1999) g ORDER BY g, s`, subIDs); err != nil {
		b.Fatal(err)
	}
	if _, err := tb.pool.Exec(ctx, `ANALYZE bridge.deliveries`); err != nil {
		b.Fatal(err)
	}
	benchClaims(b, tb)
}

// BenchmarkClaimBehindRetry is the known slow case: one stream of 20,000
// pending rows whose head waits for a retry, in front (by seq) of 10 other
// streams' rows. Each claim walks the blocked stream's rows, probing each,
// before it reaches the claimable heads: the cost grows with that stream's
// backlog (see docs/benchmarks.md).
func BenchmarkClaimBehindRetry(b *testing.B) {
	tb := setupB(b)
	ctx := context.Background()
	var sub string
	if err := tb.pool.QueryRow(ctx, `INSERT INTO bridge.subscriptions (url, event_types) VALUES ('https://x.example/', '{*}') RETURNING id::text`).Scan(&sub); err != nil {
		b.Fatal(err)
	}
	if _, err := tb.pool.Exec(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at, next_attempt_at)
SELECT $1, 'blocked-' || g, 't', 'bench', 'blocked', g, '{}', now(), CASE WHEN g = 1 THEN now() + interval '1 hour' ELSE now() END
FROM generate_series(1, 20000) g`, sub); err != nil {
		b.Fatal(err)
	}
	if _, err := tb.pool.Exec(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at)
SELECT $1, 'free-' || g, 't', 'bench', 'free-' || (g % 10), g, '{}', now() FROM generate_series(1, 100) g`, sub); err != nil {
		b.Fatal(err)
	}
	if _, err := tb.pool.Exec(ctx, `ANALYZE bridge.deliveries`); err != nil {
		b.Fatal(err)
	}
	benchClaims(b, tb)
}

// benchClaims times one claim of up to 32 deliveries per iteration, giving
// the claims back (untimed) after each so the backlog stays as it was, and
// reports the rows each claim took. A claim of nothing fails: the backlog
// was not set up as the benchmark meant.
func benchClaims(b *testing.B, tb *testBundle) {
	ctx := context.Background()
	p := ClaimParams{ClaimedBy: "bench", Limit: 32, MaxInFlight: 8, Lease: time.Minute}
	claimed := 0
	for b.Loop() {
		cs, err := tb.store.Claim(ctx, p)
		if err != nil {
			b.Fatal(err)
		}
		if len(cs) == 0 {
			b.Fatal("claimed nothing from the backlog")
		}
		claimed += len(cs)
		b.StopTimer()
		if _, err := tb.store.ReleaseAll(ctx, "bench"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(claimed)/float64(b.N), "rows/claim")
}
