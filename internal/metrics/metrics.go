package metrics

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
)

// scope is the instrumentation scope of every bridge instrument.
const scope = "github.com/outboxbridge/bridge"

// DefaultRefreshInterval is how often, at most, a database- or Kafka-backed
// gauge is re-read.
const DefaultRefreshInterval = 10 * time.Second

// Options configures New. Zero values take the defaults given.
type Options struct {
	// Resource describes the process (service.name, service.version, …);
	// Prometheus shows it as target_info. nil: the SDK's default resource.
	Resource *resource.Resource
	// RefreshInterval: a gauge backed by a query is re-read at most this
	// often. Default DefaultRefreshInterval.
	RefreshInterval time.Duration
	// Readers are extra metric readers (e.g. a periodic OTLP reader).
	Readers []sdkmetric.Reader
	// Logger reports failed refreshes. Default discards.
	Logger *slog.Logger
}

// Metrics owns the process's MeterProvider, its Prometheus registry and the
// bridge's instruments.
type Metrics struct {
	provider *sdkmetric.MeterProvider
	registry *prometheus.Registry
	meter    metric.Meter
	every    time.Duration
	log      *slog.Logger

	refreshErrors metric.Int64Counter

	relay    relayInstruments
	delivery deliveryInstruments
	admin    adminInstruments

	// Series exported at 0 before their first event (see Relay,
	// Deliveries): an alert on increase() misses a series' first event
	// when the series is created by it.
	relayZero, deliveryZero sync.Once
	relayTopics             sync.Map // topic → struct{}: its counters exist
}

// Latency buckets in seconds: from a few milliseconds (a healthy relay wakes
// on NOTIFY) up to the hours a retried row or webhook may take.
var latencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 4 * 3600}

// Webhook attempt durations: bounded by WEBHOOK_TIMEOUT (15s by default).
var attemptBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60}

// New creates the meter provider with a Prometheus exporter on a registry of
// its own (plus the Go runtime and process collectors) and the bridge's
// instruments.
func New(opts Options) (*Metrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	exp, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		// Stated rather than left to the exporter's default, which depends
		// on a global in prometheus/common: the names in
		// docs/observability.md and deploy/ must not change under us.
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
		// Every series would otherwise carry otel_scope_name and
		// otel_scope_version labels with the same value.
		otelprom.WithoutScopeInfo(),
	)
	if err != nil {
		return nil, fmt.Errorf("create prometheus exporter: %w", err)
	}
	popts := []sdkmetric.Option{sdkmetric.WithReader(exp)}
	if opts.Resource != nil {
		popts = append(popts, sdkmetric.WithResource(opts.Resource))
	}
	for _, r := range opts.Readers {
		popts = append(popts, sdkmetric.WithReader(r))
	}
	provider := sdkmetric.NewMeterProvider(popts...)
	m := &Metrics{
		provider: provider,
		registry: reg,
		meter:    provider.Meter(scope),
		every:    cmp.Or(opts.RefreshInterval, DefaultRefreshInterval),
		log:      opts.Logger,
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	var errs []error
	m.refreshErrors, err = m.meter.Int64Counter("bridge.metrics.refresh_errors",
		metric.WithDescription("Failed reads of a database- or Kafka-backed gauge (the last good value is still served)."),
		metric.WithUnit("{error}"))
	errs = append(errs, err)
	errs = append(errs, m.relay.init(m.meter), m.delivery.init(m.meter), m.admin.init(m.meter))
	for _, err := range errs {
		if err != nil {
			provider.Shutdown(context.Background()) //nolint:errcheck
			return nil, fmt.Errorf("create instruments: %w", err)
		}
	}
	return m, nil
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry})
}

// MeterProvider is the provider behind the bridge's instruments, for
// instrumentation libraries that take one (kotel, otelhttp).
func (m *Metrics) MeterProvider() metric.MeterProvider { return m.provider }

// Shutdown stops the provider (and flushes extra readers). Safe to call twice.
func (m *Metrics) Shutdown(ctx context.Context) error {
	if err := m.provider.Shutdown(ctx); err != nil && err != sdkmetric.ErrReaderShutdown {
		return fmt.Errorf("shut down metrics: %w", err)
	}
	return nil
}
