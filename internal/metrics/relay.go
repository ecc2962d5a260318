package metrics

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/outboxbridge/bridge/internal/outboxstore"
	"github.com/outboxbridge/bridge/internal/relay"
)

// parkReasons are the reason label's values (docs/observability.md).
var parkReasons = []string{"poison", "exhausted"}

type relayInstruments struct {
	produced       metric.Int64Counter
	produceLatency metric.Float64Histogram
	attempts       metric.Int64Counter
	parked         metric.Int64Counter
	outage         metric.Int64Gauge
}

func (r *relayInstruments) init(m metric.Meter) error {
	var errs [5]error
	r.produced, errs[0] = m.Int64Counter("bridge.relay.produced",
		metric.WithDescription("Outbox rows acknowledged by Kafka, by topic."),
		metric.WithUnit("{row}"))
	r.produceLatency, errs[1] = m.Float64Histogram("bridge.relay.produce_latency",
		metric.WithDescription("Time from the outbox row's commit (created_at) to the broker's acknowledgement, by topic."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	r.attempts, errs[2] = m.Int64Counter("bridge.relay.attempts_charged",
		metric.WithDescription("Failed sends charged to a row (an outage charges none), by topic."),
		metric.WithUnit("{attempt}"))
	r.parked, errs[3] = m.Int64Counter("bridge.relay.parked",
		metric.WithDescription("Rows parked as FAILED, by topic and reason (poison: retrying cannot help; exhausted: RELAY_MAX_ATTEMPTS reached)."),
		metric.WithUnit("{row}"))
	r.outage, errs[4] = m.Int64Gauge("bridge.relay.outage",
		// No unit: "1" would make the Prometheus name bridge_relay_outage_ratio.
		metric.WithDescription("1 while this relay sees no reachable broker (nothing is charged meanwhile), else 0."))
	return errors.Join(errs[:]...)
}

// Relay returns the relay.Metrics implementation recording into m. The
// first call exports bridge_relay_outage at 0: a series that appears only
// with the first outage is one an alert on it never saw at 0. The
// topic-labelled counters cannot be exported before their topic is known;
// each starts at 0 for the topic the first time the relay reports
// anything about it (see relayMetrics.topic).
func (m *Metrics) Relay() relay.Metrics {
	m.relayZero.Do(func() { m.relay.outage.Record(context.Background(), 0) })
	return relayMetrics{m: m}
}

type relayMetrics struct{ m *Metrics }

var _ relay.Metrics = relayMetrics{}

func topicAttr(topic string) metric.MeasurementOption {
	return metric.WithAttributes(attribute.String("topic", topic))
}

// topic exports the topic's counters at 0 the first time it is seen, so
// that its first charged attempt or parked row is an increase() from 0
// rather than a new series at 1 (which rate() and increase() miss).
func (r relayMetrics) topic(topic string) {
	if _, seen := r.m.relayTopics.LoadOrStore(topic, struct{}{}); seen {
		return
	}
	ctx := context.Background()
	opt := topicAttr(topic)
	r.m.relay.produced.Add(ctx, 0, opt)
	r.m.relay.attempts.Add(ctx, 0, opt)
	for _, reason := range parkReasons {
		r.m.relay.parked.Add(ctx, 0, metric.WithAttributes(attribute.String("topic", topic), attribute.String("reason", reason)))
	}
}

func (r relayMetrics) Produced(topic string, latency time.Duration) {
	r.topic(topic)
	ctx := context.Background()
	opt := topicAttr(topic)
	r.m.relay.produced.Add(ctx, 1, opt)
	r.m.relay.produceLatency.Record(ctx, max(latency, 0).Seconds(), opt)
}

func (r relayMetrics) AttemptCharged(topic string) {
	r.topic(topic)
	r.m.relay.attempts.Add(context.Background(), 1, topicAttr(topic))
}

func (r relayMetrics) Parked(topic, reason string) {
	r.topic(topic)
	r.m.relay.parked.Add(context.Background(), 1,
		metric.WithAttributes(attribute.String("topic", topic), attribute.String("reason", reason)))
}

func (r relayMetrics) Outage(active bool) {
	v := int64(0)
	if active {
		v = 1
	}
	r.m.relay.outage.Record(context.Background(), v)
}

// ObserveOutbox registers the outbox gauges (rows by status, the oldest NEW
// row's age, FAILED rows by topic), read with outboxstore.ReadGaugeStats at
// most once per refresh interval (SENT is an estimate there: see it). The
// returned function unregisters them.
func (m *Metrics) ObserveOutbox(pool *pgxpool.Pool) (func() error, error) {
	return m.observeOutbox(func(ctx context.Context) (outboxstore.Stats, error) { return outboxstore.ReadGaugeStats(ctx, pool) })
}

func (m *Metrics) observeOutbox(read func(context.Context) (outboxstore.Stats, error)) (func() error, error) {
	rows, err1 := m.meter.Int64ObservableGauge("bridge.outbox.rows",
		metric.WithDescription("Rows in bridge.outbox by status (NEW, SENT, FAILED); a log table is truncated once every lane passed it and RELAY_RETENTION elapsed."),
		metric.WithUnit("{row}"))
	age, err2 := m.meter.Float64ObservableGauge("bridge.outbox.oldest_new_age",
		metric.WithDescription("Age of the oldest NEW outbox row (0 when none waits): the relay's lag, the number to alert on."),
		metric.WithUnit("s"))
	failed, err3 := m.meter.Int64ObservableGauge("bridge.outbox.failed_rows",
		metric.WithDescription("FAILED (parked) outbox rows by topic, waiting for `bridge outbox replay`."),
		metric.WithUnit("{row}"))
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, fmt.Errorf("create outbox gauges: %w", err)
	}
	stats := newCached("outbox", m.every, read, m.onRefreshError)
	m.zeroRefreshErrors("outbox")
	reg, err := m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		st, ok := stats.get(ctx)
		if !ok {
			return nil
		}
		for status, n := range st.ByStatus {
			o.ObserveInt64(rows, n, metric.WithAttributes(attribute.String("status", status)))
		}
		o.ObserveFloat64(age, st.OldestNewAgeSeconds)
		for topic, n := range st.FailedByTopic {
			o.ObserveInt64(failed, n, topicAttr(topic))
		}
		return nil
	}, rows, age, failed)
	if err != nil {
		return nil, fmt.Errorf("register outbox gauges: %w", err)
	}
	return reg.Unregister, nil
}
