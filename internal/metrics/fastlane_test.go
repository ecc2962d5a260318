package metrics

import (
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/fastlane"
	"github.com/outboxbridge/bridge/internal/metrics/metricstest"
)

type fakeLane struct {
	stats  fastlane.Stats
	gauges fastlane.Gauges
}

func (f *fakeLane) Stats() fastlane.Stats   { return f.stats }
func (f *fakeLane) Gauges() fastlane.Gauges { return f.gauges }

func TestFastLaneCountersAndGauges(t *testing.T) {
	t.Parallel()
	m := newMetrics(t, time.Hour)
	l := &fakeLane{
		stats: fastlane.Stats{Records: 40, Delivered: 110, Failed: 2, HandedOver: 9, Duplicates: 1, Unparked: 1,
			RouteChecks: 7, RouteReads: 2},
		gauges: fastlane.Gauges{Streams: 30, Parked: 3, Queued: 12, InFlight: 5, HeldBytes: 4096, Partitions: []fastlane.PartitionGauge{
			{Topic: "assets", Partition: 0, Settled: 100, HighWatermark: 130, Lag: 30, Held: 25, HeldBytes: 4000, Isolated: 1},
			{Topic: "assets", Partition: 1, Settled: -1, HighWatermark: -1, Lag: -1}, // nothing read yet: no lag or offset exported
		}},
	}
	unregister, err := m.ObserveFastLane(l, "outbox-bridge-deliver")
	if err != nil {
		t.Fatal(err)
	}
	f := metricstest.Scrape(t, m.Handler())
	want(t, f, "bridge_fastlane_records_total", nil, 40)
	want(t, f, "bridge_fastlane_delivered_total", nil, 110)
	want(t, f, "bridge_fastlane_failed_total", nil, 2)
	want(t, f, "bridge_fastlane_handed_over_total", nil, 9)
	want(t, f, "bridge_fastlane_duplicates_total", nil, 1)
	want(t, f, "bridge_fastlane_unparked_total", nil, 1)
	want(t, f, "bridge_fastlane_route_checks_total", nil, 7)
	want(t, f, "bridge_fastlane_route_reads_total", nil, 2)
	want(t, f, "bridge_fastlane_parked_streams", nil, 3)
	want(t, f, "bridge_fastlane_queued_deliveries", nil, 12)
	want(t, f, "bridge_fastlane_in_flight", nil, 5)
	want(t, f, "bridge_fastlane_held_bytes", nil, 4096)
	p0 := map[string]string{"group": "outbox-bridge-deliver", "topic": "assets", "partition": "0"}
	want(t, f, "bridge_fastlane_lag", p0, 30)
	want(t, f, "bridge_fastlane_settled_offset", p0, 100)
	want(t, f, "bridge_fastlane_held_records", p0, 25)
	want(t, f, "bridge_fastlane_isolated_subscriptions", p0, 1)
	p1 := map[string]string{"partition": "1"}
	if _, ok := f.Value("bridge_fastlane_lag", p1); ok {
		t.Error("an unknown lag (-1) was exported")
	}
	if _, ok := f.Value("bridge_fastlane_settled_offset", p1); ok {
		t.Error("an unknown settled offset (-1) was exported")
	}
	want(t, f, "bridge_fastlane_held_records", p1, 0)
	l.stats.Delivered = 111 // read at every scrape
	want(t, metricstest.Scrape(t, m.Handler()), "bridge_fastlane_delivered_total", nil, 111)
	if err := unregister(); err != nil {
		t.Fatal(err)
	}
	if metricstest.Scrape(t, m.Handler()).Has("bridge_fastlane_records_total") {
		t.Error("fast lane series still exported after unregister")
	}
}
