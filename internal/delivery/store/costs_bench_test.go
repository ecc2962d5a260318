package store

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/outbox"
)

// What two features cost at run time, on the real database (numbers in
// docs/benchmarks.md):
//
//	go test -run '^$' -bench 'Death|CopyHistory' -benchtime 2000x -count 3 ./internal/delivery/store/

// BenchmarkDeath records deaths one at a time, as the deliverer does, with
// operational events off (BRIDGE_OPERATIONS_TOPIC empty: one batch, the old
// statements) and on (the death and its delivery.dead event in one
// transaction). WEBHOOK_DISABLE_AFTER is out of reach, so no warning or
// disable is announced: the cost is the delivery.dead event alone.
func BenchmarkDeath(b *testing.B) {
	for _, ops := range []string{"", "bridge.operations"} {
		name := "operations=off"
		if ops != "" {
			name = "operations=on"
		}
		b.Run(name, func(b *testing.B) {
			tb := setupB(b)
			ctx := context.Background()
			url := "https://dead.example/in"
			sub, err := tb.subs.Create(ctx, SubscriptionInput{URL: &url, EventTypes: []string{"*"}})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tb.pool.Exec(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at)
SELECT $1, 'e-' || g, 'asset.updated', 'assets', 'asset-' || g, 1, '{}', now() FROM generate_series(1, $2) g`, sub.ID, b.N); err != nil {
				b.Fatal(err)
			}
			cs, err := tb.store.Claim(ctx, ClaimParams{ClaimedBy: "w", Limit: b.N, MaxInFlight: b.N, Lease: time.Hour})
			if err != nil || len(cs) != b.N {
				b.Fatalf("claimed %d of %d: %v", len(cs), b.N, err)
			}
			tb.store.Operations = ops
			out := Outcome{StartedAt: time.Now(), Duration: time.Millisecond, StatusCode: 500, Error: "HTTP 500"}
			b.ResetTimer()
			for i := range cs {
				if _, err := tb.store.Dead(ctx, &cs[i], "w", out, 1<<30, false); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deaths/s")
			var announced int
			_ = tb.pool.QueryRow(ctx, `SELECT count(*) FROM bridge.outbox WHERE topic = 'bridge.operations'`).Scan(&announced)
			if want := map[bool]int{true: b.N, false: 0}[ops != ""]; announced != want {
				b.Fatalf("%d operational events; want %d", announced, want)
			}
		})
	}
}

// BenchmarkCopyHistory copies the history of a subscription created with
// --since over historyRows retained outbox rows (100 assets), in the
// deliverer's batches of 500, once per iteration (a new subscription each
// time), and reports rows copied per second.
func BenchmarkCopyHistory(b *testing.B) {
	const historyRows, batch = 20_000, 500
	tb := setupB(b)
	ctx := context.Background()
	events := make([]outbox.Event, 0, 1000)
	for n := 0; n < historyRows; n += cap(events) {
		events = events[:0]
		for i := range cap(events) {
			events = append(events, outbox.Event{Topic: "assets", AssetID: fmt.Sprintf("asset-%d", (n+i)%100),
				EventType: "asset.updated", Payload: json.RawMessage(`{"pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`)})
		}
		if err := pgx.BeginFunc(ctx, tb.pool, func(tx pgx.Tx) error {
			_, err := outbox.EnqueueBatch(ctx, tx, events)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	// Sent, and read by the consumer (history only reaches topics it reads).
	if _, err := tb.pool.Exec(ctx, `UPDATE bridge.outbox SET status = 'SENT', sent_at = now()`); err != nil {
		b.Fatal(err)
	}
	if _, err := tb.pool.Exec(ctx, `INSERT INTO bridge.consumer_inbox (dedup_id, topic, kafka_partition, kafka_offset) VALUES ('r1', 'assets', 0, 0)`); err != nil {
		b.Fatal(err)
	}
	since, topic := time.Now().Add(-time.Hour), "assets"
	var copied int
	b.ResetTimer()
	for i := range b.N {
		url := fmt.Sprintf("https://history-%d.example/in", i)
		b.StopTimer()
		if _, err := tb.subs.Create(ctx, SubscriptionInput{URL: &url, EventTypes: []string{"*"}, Topic: &topic, Since: &since}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for {
			bt, ok, err := tb.store.CopyHistory(ctx, batch)
			if err != nil || !ok {
				b.Fatalf("copy: ok=%v %v", ok, err)
			}
			copied += bt.Copied
			if bt.Done {
				break
			}
		}
	}
	b.StopTimer()
	if copied != b.N*historyRows {
		b.Fatalf("copied %d deliveries; want %d", copied, b.N*historyRows)
	}
	b.ReportMetric(float64(copied)/b.Elapsed().Seconds(), "rows/s")
}
