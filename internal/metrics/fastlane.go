package metrics

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/outboxbridge/bridge/internal/delivery/fastlane"
)

// FastLaneSource is what ObserveFastLane reads; *fastlane.Lane implements
// it.
type FastLaneSource interface {
	Stats() fastlane.Stats
	Gauges() fastlane.Gauges
}

var _ FastLaneSource = (*fastlane.Lane)(nil)

// ObserveFastLane exports the fast lane's counters and its state at every
// scrape: per owned partition the settled offset, the lag behind the end
// offset, the records held in memory and the isolated subscriptions; for
// the member the streams parked, the deliveries queued and in flight, and
// the bytes held. group labels the partitions' series. The returned
// function unregisters them; call it before the lane stops.
func (m *Metrics) ObserveFastLane(l FastLaneSource, group string) (func() error, error) {
	counter := func(name, desc, unit string) (metric.Int64ObservableCounter, error) {
		return m.meter.Int64ObservableCounter(name, metric.WithDescription(desc), metric.WithUnit(unit))
	}
	gauge := func(name, desc, unit string) (metric.Int64ObservableGauge, error) {
		return m.meter.Int64ObservableGauge(name, metric.WithDescription(desc), metric.WithUnit(unit))
	}
	records, e1 := counter("bridge.fastlane.records", "Kafka records read by the fast lane.", "{record}")
	delivered, e2 := counter("bridge.fastlane.delivered", "Deliveries the fast lane posted with a 2xx answer.", "{delivery}")
	failed, e3 := counter("bridge.fastlane.failed", "Fast-lane attempts that failed (each parked its stream in the slow lane).", "{attempt}")
	handed, e4 := counter("bridge.fastlane.handed_over", "Deliveries the fast lane wrote to bridge.deliveries (parked streams, isolated subscriptions).", "{delivery}")
	dups, e5 := counter("bridge.fastlane.duplicates", "Records dropped because they repeated the previous record's dedup id on their partition.", "{record}")
	unparked, e6 := counter("bridge.fastlane.unparked", "Streams that came back to the fast lane once the slow lane had emptied them.", "{stream}")
	lag, e7 := gauge("bridge.fastlane.lag", "Records of an owned partition not yet settled by every subscription (end offset minus settled offset).", "{record}")
	settled, e8 := gauge("bridge.fastlane.settled_offset", "Offset of an owned partition below which every record is settled (what the next commit writes).", "{offset}")
	held, e9 := gauge("bridge.fastlane.held_records", "Records of an owned partition held in memory (read, not yet committed past).", "{record}")
	isolated, e10 := gauge("bridge.fastlane.isolated_subscriptions", "Subscriptions whose deliveries of the partition go through the slow lane for now (slow, or holding the partition's offset).", "{subscription}")
	parked, e11 := gauge("bridge.fastlane.parked_streams", "Streams held by this member whose deliveries go to the slow lane.", "{stream}")
	queued, e12 := gauge("bridge.fastlane.queued_deliveries", "Deliveries in memory waiting for their stream's turn or a worker.", "{delivery}")
	inFlight, e13 := gauge("bridge.fastlane.in_flight", "Fast-lane requests being sent.", "{request}")
	heldBytes, e14 := gauge("bridge.fastlane.held_bytes", "Record bytes held in memory (bounded by the fast lane's buffer).", "By")
	deadLettered, e16 := counter("bridge.fastlane.dead_lettered", "Records the fast lane produced to <topic>.dlq (unreadable, or refused by PostgreSQL at a hand-over).", "{record}")
	limit, e15 := gauge("bridge.fastlane.in_flight_limit", "The member's live limit on fast-lane requests in flight (WEBHOOK_FAST_LANE_IN_FLIGHT_LIMIT; at most WEBHOOK_WORKERS).", "{request}")
	checks, e17 := counter("bridge.fastlane.route_checks", "Checks of bridge.subscriptions_version run because polled records were newer than the routes held.", "{check}")
	reads, e18 := counter("bridge.fastlane.route_reads", "Full reads of the subscriptions that a version check led to (the version had moved).", "{read}")
	if err := errors.Join(e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15, e16, e17, e18); err != nil {
		return nil, fmt.Errorf("create fast lane instruments: %w", err)
	}
	groupAttr := attribute.String("group", group)
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := l.Stats()
		o.ObserveInt64(records, st.Records)
		o.ObserveInt64(delivered, st.Delivered)
		o.ObserveInt64(failed, st.Failed)
		o.ObserveInt64(handed, st.HandedOver)
		o.ObserveInt64(dups, st.Duplicates)
		o.ObserveInt64(deadLettered, st.DeadLettered)
		o.ObserveInt64(unparked, st.Unparked)
		o.ObserveInt64(limit, st.InFlightLimit)
		o.ObserveInt64(checks, st.RouteChecks)
		o.ObserveInt64(reads, st.RouteReads)
		g := l.Gauges()
		o.ObserveInt64(parked, int64(g.Parked))
		o.ObserveInt64(queued, int64(g.Queued))
		o.ObserveInt64(inFlight, int64(g.InFlight))
		o.ObserveInt64(heldBytes, g.HeldBytes)
		for _, p := range g.Partitions {
			attrs := metric.WithAttributes(groupAttr, attribute.String("topic", p.Topic), attribute.Int("partition", int(p.Partition)))
			if p.Lag >= 0 {
				o.ObserveInt64(lag, p.Lag, attrs) // unknown: no value beats a wrong one
			}
			if p.Settled >= 0 {
				o.ObserveInt64(settled, p.Settled, attrs)
			}
			o.ObserveInt64(held, int64(p.Held), attrs)
			o.ObserveInt64(isolated, int64(p.Isolated), attrs)
		}
		return nil
	}, records, delivered, failed, handed, dups, deadLettered, unparked, lag, settled, held, isolated, parked, queued, inFlight, heldBytes, limit, checks, reads)
	if err != nil {
		return nil, fmt.Errorf("register fast lane instruments: %w", err)
	}
	return reg.Unregister, nil
}
