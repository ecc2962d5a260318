package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/outbox"
)

// The cost of per-asset ordering: writers of one asset serialise on its
// counter row until commit. These benchmarks run 8 concurrent writers, each
// committing one event per transaction, on one hot asset versus spread over
// 1,000 assets; the difference is what the serialisation costs.
func benchmarkEnqueue(b *testing.B, assets int) {
	db := pgtest.New(b)
	ctx := context.Background()
	payload := json.RawMessage(`{"field":"value","n":1}`)
	var n atomic.Int64
	b.SetParallelism(4) // 4 × GOMAXPROCS writers
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			asset := fmt.Sprintf("asset-%d", i%int64(assets))
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: "bench", AssetID: asset, EventType: "e", Payload: payload})
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

func BenchmarkEnqueueOneHotAsset(b *testing.B)          { benchmarkEnqueue(b, 1) }
func BenchmarkEnqueueSpreadOver1000Assets(b *testing.B) { benchmarkEnqueue(b, 1000) }

// EnqueueBatch: 100 events per transaction over 10 assets.
func BenchmarkEnqueueBatch100(b *testing.B) {
	db := pgtest.New(b)
	ctx := context.Background()
	evs := make([]outbox.Event, 100)
	for i := range evs {
		evs[i] = outbox.Event{Topic: "bench", AssetID: fmt.Sprintf("asset-%d", i%10), EventType: "e", Payload: json.RawMessage(`{"n":1}`)}
	}
	b.ResetTimer()
	for b.Loop() {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := outbox.EnqueueBatch(ctx, tx, evs)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(evs))/b.Elapsed().Seconds(), "events/s")
}
