package metrics

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxbridge/bridge/internal/consumer"
	"github.com/outboxbridge/bridge/internal/metrics/metricstest"
)

type fakeConsumer struct {
	stats  consumer.Stats
	lags   atomic.Int64 // Lag calls
	lagErr error
}

func (f *fakeConsumer) Stats() consumer.Stats { return f.stats }

func (f *fakeConsumer) Lag(context.Context) ([]consumer.PartitionLag, error) {
	f.lags.Add(1)
	if f.lagErr != nil {
		return nil, f.lagErr
	}
	return []consumer.PartitionLag{
		{Topic: "assets", Partition: 0, Committed: 10, End: 15, Lag: 5},
		{Topic: "assets", Partition: 1, Committed: 7, End: 7, Lag: 0},
		{Topic: "assets", Partition: 2, Committed: -1, End: -1, Lag: -1}, // unreadable: not exported
	}, nil
}

func TestConsumerCountersAndLag(t *testing.T) {
	t.Parallel()
	m := newMetrics(t, time.Hour)
	c := &fakeConsumer{stats: consumer.Stats{Records: 12, Duplicates: 2, DeadLettered: 1, Deliveries: 18, CommitFailures: 1}}
	unregister, err := m.ObserveConsumer(c, "outbox-bridge")
	if err != nil {
		t.Fatal(err)
	}
	f := metricstest.Scrape(t, m.Handler())
	want(t, f, "bridge_consumer_records_total", nil, 12)
	want(t, f, "bridge_consumer_duplicates_total", nil, 2)
	want(t, f, "bridge_consumer_dead_lettered_total", nil, 1)
	want(t, f, "bridge_consumer_deliveries_created_total", nil, 18)
	want(t, f, "bridge_consumer_commit_failures_total", nil, 1)
	want(t, f, "bridge_consumer_lag", map[string]string{"group": "outbox-bridge", "topic": "assets", "partition": "0"}, 5)
	want(t, f, "bridge_consumer_lag", map[string]string{"topic": "assets", "partition": "1"}, 0)
	if _, ok := f.Value("bridge_consumer_lag", map[string]string{"partition": "2"}); ok {
		t.Error("an unreadable lag (-1) was exported")
	}
	c.stats.Records = 13 // counters are read at every scrape, lag once per interval
	f = metricstest.Scrape(t, m.Handler())
	want(t, f, "bridge_consumer_records_total", nil, 13)
	if n := c.lags.Load(); n != 1 {
		t.Errorf("Lag called %d times in one interval, want 1", n)
	}
	if err := unregister(); err != nil {
		t.Fatal(err)
	}
	if metricstest.Scrape(t, m.Handler()).Has("bridge_consumer_records_total") {
		t.Error("consumer series still exported after unregister")
	}
}

// A group that has not joined yet has no lag, and that is no error.
func TestConsumerLagBeforeTheGroupExists(t *testing.T) {
	t.Parallel()
	m := newMetrics(t, time.Hour)
	c := &fakeConsumer{lagErr: fmt.Errorf("consumer group lag: %w", kerr.GroupIDNotFound)}
	unregister, err := m.ObserveConsumer(c, "g")
	if err != nil {
		t.Fatal(err)
	}
	defer unregister() //nolint:errcheck
	f := metricstest.Scrape(t, m.Handler())
	if v, _ := f.Value("bridge_metrics_refresh_errors_total", map[string]string{"source": "consumer_lag"}); v != 0 || f.Has("bridge_consumer_lag") {
		t.Errorf("GROUP_ID_NOT_FOUND counted as a refresh error (%v) or exported as lag", v)
	}
	want(t, f, "bridge_consumer_records_total", nil, 0)
}
