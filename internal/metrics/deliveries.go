package metrics

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Delivery attempt outcomes.
const (
	OutcomeDelivered = "delivered" // 2xx: done
	OutcomeRetry     = "retry"     // failed; scheduled again
	OutcomeDead      = "dead"      // failed for the last time (or 410 Gone)
)

type deliveryInstruments struct {
	attempts metric.Int64Counter
	duration metric.Float64Histogram
	disabled metric.Int64Counter
}

func (d *deliveryInstruments) init(m metric.Meter) error {
	var errs [3]error
	d.attempts, errs[0] = m.Int64Counter("bridge.delivery.attempts",
		metric.WithDescription("Webhook HTTP attempts by outcome (delivered, retry, dead) and status_class (2xx…5xx, none when no response arrived)."),
		metric.WithUnit("{attempt}"))
	d.duration, errs[1] = m.Float64Histogram("bridge.delivery.attempt_duration",
		metric.WithDescription("Duration of one webhook HTTP attempt, by outcome."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(attemptBuckets...))
	d.disabled, errs[2] = m.Int64Counter("bridge.subscriptions.disabled",
		metric.WithDescription("Subscriptions disabled by the deliverer (WEBHOOK_DISABLE_AFTER consecutive dead deliveries, or 410 Gone)."),
		metric.WithUnit("{subscription}"))
	return errors.Join(errs[:]...)
}

// StatusClass maps an HTTP status code to "2xx"…"5xx", or "none" when no
// response arrived (timeout, refused connection, blocked address).
func StatusClass(code int) string {
	if code < 100 || code > 599 {
		return "none"
	}
	return strconv.Itoa(code/100) + "xx"
}

// Deliveries records what the delivery engine does. Its methods are the
// hook the webhook Deliverer reports through (see docs/observability.md).
type Deliveries struct{ m *Metrics }

// Deliveries returns the delivery hook recording into m. The first call
// exports every attempt series that can occur at 0 (delivered with 2xx;
// retry and dead with any other class or none) and the disable counter, so
// an alert on increase(bridge_delivery_attempts_total{outcome="dead"})
// sees the first death after a restart. The duration histogram has no
// zero form; its series appear with their first attempt.
func (m *Metrics) Deliveries() Deliveries {
	m.deliveryZero.Do(func() {
		ctx := context.Background()
		add := func(outcome, class string) {
			m.delivery.attempts.Add(ctx, 0, metric.WithAttributes(
				attribute.String("outcome", outcome), attribute.String("status_class", class)))
		}
		add(OutcomeDelivered, "2xx")
		for _, outcome := range []string{OutcomeRetry, OutcomeDead} {
			for _, class := range []string{"1xx", "3xx", "4xx", "5xx", "none"} {
				add(outcome, class)
			}
		}
		m.delivery.disabled.Add(ctx, 0)
	})
	return Deliveries{m: m}
}

// Attempt records one HTTP attempt: its status code (0: no response), its
// duration and its outcome (OutcomeDelivered, OutcomeRetry, OutcomeDead).
func (d Deliveries) Attempt(statusCode int, duration time.Duration, outcome string) {
	ctx := context.Background()
	class := StatusClass(statusCode)
	d.m.delivery.attempts.Add(ctx, 1, attemptAttrs(outcome, class))
	d.m.delivery.duration.Record(ctx, max(duration, 0).Seconds(), outcomeAttrs(outcome))
}

// attemptSets and outcomeSets hold the attribute sets of the outcomes and
// status classes that occur: Attempt runs for every webhook request, and
// building and sorting a new set each time was most of its cost.
var attemptSets, outcomeSets sync.Map // attemptKey or outcome → metric option

type attemptKey struct{ outcome, class string }

func attemptAttrs(outcome, class string) metric.AddOption {
	key := attemptKey{outcome, class}
	if o, ok := attemptSets.Load(key); ok {
		return o.(metric.AddOption)
	}
	o, _ := attemptSets.LoadOrStore(key, metric.WithAttributeSet(attribute.NewSet(
		attribute.String("outcome", outcome), attribute.String("status_class", class))))
	return o.(metric.AddOption)
}

func outcomeAttrs(outcome string) metric.RecordOption {
	if o, ok := outcomeSets.Load(outcome); ok {
		return o.(metric.RecordOption)
	}
	o, _ := outcomeSets.LoadOrStore(outcome, metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", outcome))))
	return o.(metric.RecordOption)
}

// SubscriptionDisabled records a subscription disabled by the deliverer.
func (d Deliveries) SubscriptionDisabled() {
	d.m.delivery.disabled.Add(context.Background(), 1)
}

// deliveryStats is one read of the delivery tables.
type deliveryStats struct {
	byStatus             map[string]int64
	enabled, disabled    int64
	oldestBySubscription map[string]float64
	// historyRemaining: per subscription still copying its history
	// (create --since), the outbox rows its copy has not looked at yet.
	historyRemaining map[string]int64
}

func readDeliveryStats(ctx context.Context, pool *pgxpool.Pool) (deliveryStats, error) {
	st := deliveryStats{
		byStatus:             map[string]int64{"pending": 0, "delivering": 0, "delivered": 0, "dead": 0},
		oldestBySubscription: map[string]float64{},
		historyRemaining:     map[string]int64{},
	}
	byStatus, err := store.CountByStatus(ctx, pool)
	if err != nil {
		return st, err
	}
	maps.Copy(st.byStatus, byStatus)
	if st.enabled, st.disabled, err = store.CountSubscriptions(ctx, pool); err != nil {
		return st, err
	}
	if st.historyRemaining, err = store.HistoryRemaining(ctx, pool); err != nil {
		return st, err
	}
	oldest, err := store.OldestOpen(ctx, pool)
	if err != nil {
		return st, err
	}
	for id, age := range oldest {
		st.oldestBySubscription[id] = 0
		if age != nil {
			st.oldestBySubscription[id] = max(*age, 0)
		}
	}
	return st, nil
}

// ObserveDeliveries registers the delivery gauges (deliveries by status,
// subscriptions by state, the oldest open delivery's age per subscription),
// read at most once per refresh interval. The returned function unregisters
// them.
func (m *Metrics) ObserveDeliveries(pool *pgxpool.Pool) (func() error, error) {
	byStatus, err1 := m.meter.Int64ObservableGauge("bridge.deliveries",
		metric.WithDescription("Rows in bridge.deliveries by status (pending, delivering, delivered, dead)."),
		metric.WithUnit("{delivery}"))
	subs, err2 := m.meter.Int64ObservableGauge("bridge.subscriptions",
		metric.WithDescription("Subscriptions by state (enabled, disabled)."),
		metric.WithUnit("{subscription}"))
	oldest, err3 := m.meter.Float64ObservableGauge("bridge.delivery.oldest_pending_age",
		metric.WithDescription("Per subscription, age of its oldest delivery still pending or in flight (0 when none): how far behind that endpoint is."),
		metric.WithUnit("s"))
	history, err4 := m.meter.Int64ObservableGauge("bridge.subscription.history_remaining",
		metric.WithDescription("Per subscription still copying its history (subscriptions create --since), the outbox rows its copy has yet to look at; its deliveries wait until it is done."),
		metric.WithUnit("{row}"))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, fmt.Errorf("create delivery gauges: %w", err)
	}
	m.zeroRefreshErrors("deliveries")
	stats := newCached("deliveries", m.every, func(ctx context.Context) (deliveryStats, error) {
		return readDeliveryStats(ctx, pool)
	}, m.onRefreshError)
	reg, err := m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		st, ok := stats.get(ctx)
		if !ok {
			return nil
		}
		for s, n := range st.byStatus {
			o.ObserveInt64(byStatus, n, metric.WithAttributes(attribute.String("status", s)))
		}
		o.ObserveInt64(subs, st.enabled, metric.WithAttributes(attribute.String("state", "enabled")))
		o.ObserveInt64(subs, st.disabled, metric.WithAttributes(attribute.String("state", "disabled")))
		for id, age := range st.oldestBySubscription {
			o.ObserveFloat64(oldest, age, metric.WithAttributes(attribute.String("subscription_id", id)))
		}
		for id, n := range st.historyRemaining {
			o.ObserveInt64(history, n, metric.WithAttributes(attribute.String("subscription_id", id)))
		}
		return nil
	}, byStatus, subs, oldest, history)
	if err != nil {
		return nil, fmt.Errorf("register delivery gauges: %w", err)
	}
	return reg.Unregister, nil
}
