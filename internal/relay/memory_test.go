package relay

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/bench"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// Memory is bounded by bytes, not rows. Rows whose payload is over
// RELAY_MAX_MESSAGE_BYTES are parked from the size the claim reads, without
// their payloads ever reaching the relay, and a batch of large rows that may
// be sent stops at RELAY_BATCH_BYTES. Before, the claim read up to
// RELAY_BATCH_SIZE payloads before checking sizes: the 100 rows of 5 MB here
// would have been ~500 MB in one batch.
//
// Not parallel: the heap is measured in this process, so no other test may
// allocate meanwhile.
func TestLargeRowsKeepMemoryBounded(t *testing.T) {
	brokers := kafkatest.RealBrokers(t)
	b := setup(t, brokers)
	topic := kafkatest.CreateTopic(t, brokers, 3, nil)
	ctx := context.Background()
	const oversized, oversizedBytes = 100, 5_000_000
	const large, largeBytes = 40, 600_000
	// Written by the database itself (compressible payloads, so the fill is
	// quick): the test measures the relay, not the enqueue path.
	if _, err := b.db.Pool.Exec(ctx, `
SELECT bridge.enqueue($1, 'over-' || (g % 10), 'too.big', to_jsonb(repeat('x', $2::int)))
FROM generate_series(1, $3::int) g`, topic, oversizedBytes, oversized); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(ctx, `
SELECT bridge.enqueue($1, 'large-' || (g % 10), 'large', to_jsonb(repeat('y', $2::int)))
FROM generate_series(1, $3::int) g`, topic, largeBytes, large); err != nil {
		t.Fatal(err)
	}

	cfg := fastConfig()
	cfg.BatchSize = 1000
	cfg.MaxMessageBytes = 1_000_000
	cfg.BatchBytes = 4 << 20
	var mostRows atomic.Int64
	cfg.ClaimObserver = func(_ time.Duration, rows int) {
		for {
			m := mostRows.Load()
			if int64(rows) <= m || mostRows.CompareAndSwap(m, int64(rows)) {
				return
			}
		}
	}

	baseline := bench.HeapInuseNow()
	heap := bench.WatchHeap(5 * time.Millisecond)

	rr := b.startRelay(cfg)
	testkit.Eventually(t, 50*time.Second, func() string {
		c := b.countStatus()
		return testkit.Unless(c["FAILED"] == oversized && c["SENT"] == large, "oversized rows FAILED and large rows SENT: %s", fmt.Sprint(c))
	})
	if err := rr.stop(); err != nil {
		t.Fatal(err)
	}
	peak := heap.Stop()

	const limit = 100 << 20
	t.Logf("heap: baseline %.1f MiB, peak %.1f MiB; largest claim %d rows", bench.MiB(baseline), bench.MiB(peak), mostRows.Load())
	if peak > limit {
		t.Fatalf("peak heap %.1f MiB while parking %d rows of %d bytes, want under 100 MiB", bench.MiB(peak), oversized, oversizedBytes)
	}
	var reason string
	if err := b.db.Pool.QueryRow(ctx, `SELECT last_error FROM bridge.outbox WHERE status = 'FAILED' LIMIT 1`).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if !contains(reason, fmt.Sprintf("payload is %d bytes", oversizedBytes+2)) || !contains(reason, "RELAY_MAX_MESSAGE_BYTES") {
		t.Fatalf("park reason %q should give the payload's size and the limit", reason)
	}
}
