package metrics

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/outboxbridge/bridge/internal/consumer"
)

// ConsumerSource is what ObserveConsumer reads; *consumer.Consumer
// implements it.
type ConsumerSource interface {
	Stats() consumer.Stats
	Lag(ctx context.Context) ([]consumer.PartitionLag, error)
}

var _ ConsumerSource = (*consumer.Consumer)(nil)

// ObserveConsumer exports c's counters (read at every scrape: they are
// atomic loads) and its group's lag per partition (a round of Kafka
// requests, so at most once per refresh interval). group labels the lag.
// The returned function unregisters them; call it before c stops.
func (m *Metrics) ObserveConsumer(c ConsumerSource, group string) (func() error, error) {
	counter := func(name, desc, unit string) (metric.Int64ObservableCounter, error) {
		return m.meter.Int64ObservableCounter(name, metric.WithDescription(desc), metric.WithUnit(unit))
	}
	records, e1 := counter("bridge.consumer.records",
		"Kafka records handled by the consumer, whatever the outcome.", "{record}")
	dups, e2 := counter("bridge.consumer.duplicates",
		"Records dropped because their dedup id was already in the inbox (redelivery or duplicate produce).", "{record}")
	dlq, e3 := counter("bridge.consumer.dead_lettered",
		"Records produced to <topic>.dlq because they cannot become deliveries.", "{record}")
	created, e4 := counter("bridge.consumer.deliveries_created",
		"Delivery rows created (one per matching enabled subscription).", "{delivery}")
	commitFails, e5 := counter("bridge.consumer.commit_failures",
		"Offset commits that failed after their batch was stored (the records come back and are deduplicated).", "{commit}")
	lag, e6 := m.meter.Int64ObservableGauge("bridge.consumer.lag",
		metric.WithDescription("Records of a partition not yet committed by the consumer group (end offset minus committed offset)."),
		metric.WithUnit("{record}"))
	if err := errors.Join(e1, e2, e3, e4, e5, e6); err != nil {
		return nil, fmt.Errorf("create consumer instruments: %w", err)
	}
	m.zeroRefreshErrors("consumer_lag")
	lags := newCached("consumer_lag", m.every, func(ctx context.Context) ([]consumer.PartitionLag, error) {
		ls, err := c.Lag(ctx)
		if errors.Is(err, kerr.GroupIDNotFound) {
			// Before the group's first join there is nothing to be behind
			// on: not a failure worth a warning every interval.
			return nil, nil
		}
		return ls, err
	}, m.onRefreshError)
	groupAttr := attribute.String("group", group)
	reg, err := m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		st := c.Stats()
		o.ObserveInt64(records, st.Records)
		o.ObserveInt64(dups, st.Duplicates)
		o.ObserveInt64(dlq, st.DeadLettered)
		o.ObserveInt64(created, st.Deliveries)
		o.ObserveInt64(commitFails, st.CommitFailures)
		ls, ok := lags.get(ctx)
		if !ok {
			return nil
		}
		for _, l := range ls {
			if l.Lag < 0 {
				continue // an offset could not be read: no value beats a wrong one
			}
			o.ObserveInt64(lag, l.Lag, metric.WithAttributes(groupAttr,
				attribute.String("topic", l.Topic), attribute.Int("partition", int(l.Partition))))
		}
		return nil
	}, records, dups, dlq, created, commitFails, lag)
	if err != nil {
		return nil, fmt.Errorf("register consumer instruments: %w", err)
	}
	return reg.Unregister, nil
}
