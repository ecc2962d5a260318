package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/pgtest"
)

// BenchmarkFanout measures the consumer's database side alone: batches of
// 500 decoded records, each matching 10 subscriptions, through the inbox
// dedup, the routing read and the delivery store's one-statement fan-out, in
// one transaction per batch (what storeBatch does for a poll). rows/s is
// delivery rows written per second. No broker: the Kafka side is
// BenchmarkConsume's.
//
//	go test ./internal/consumer -run '^$' -bench Fanout -benchtime 20x
func BenchmarkFanout(b *testing.B) {
	const batch, subs = 500, 10
	db := pgtest.New(b)
	ctx := context.Background()
	for range subs {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO bridge.subscriptions (url, event_types) VALUES ('https://example.com/hook', '{*}')`); err != nil {
			b.Fatal(err)
		}
	}
	c := &Consumer{pool: db.Pool, logger: slog.New(slog.DiscardHandler)}
	payload := `{"data":"` + strings.Repeat("x", 280) + `"}`
	var total time.Duration
	for i := range b.N {
		evs := make([]*event, batch)
		for j := range evs {
			asset := fmt.Sprintf("asset-%03d", j%200)
			seq := int64(i*batch/200 + j/200 + 1)
			evs[j] = &event{
				rec:     &kgo.Record{Topic: "bench", Offset: int64(i*batch + j)},
				dedupID: fmt.Sprintf("fanout-%d-%d", i, j), eventType: "bench.event",
				assetID: &asset, assetSeq: &seq, payload: payload, createdAt: time.Now(),
			}
		}
		began := time.Now()
		outs, err := c.storeBatch(ctx, evs)
		total += time.Since(began)
		if err != nil {
			b.Fatal(err)
		}
		if outs[0].deliveries != subs {
			b.Fatalf("a record made %d deliveries, want %d", outs[0].deliveries, subs)
		}
	}
	b.ReportMetric(float64(b.N*batch*subs)/total.Seconds(), "rows/s")
	b.ReportMetric(0, "ns/op")
}
