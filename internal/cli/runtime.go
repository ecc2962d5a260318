package cli

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/adminapi"
	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/console"
	"github.com/outboxbridge/bridge/internal/consumer"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
	"github.com/outboxbridge/bridge/internal/metrics"
	"github.com/outboxbridge/bridge/internal/opsserver"
	"github.com/outboxbridge/bridge/internal/relay"
	"github.com/outboxbridge/bridge/internal/tracing"
)

// Service names: the default OTEL_SERVICE_NAME of each long-running command,
// and what startRuntime keys its choices on.
const (
	serviceRelay   = "outbox-bridge-relay"
	serviceConsume = "outbox-bridge-consume"
	serviceDeliver = "outbox-bridge-deliver"
	serviceAll     = "outbox-bridge" // `bridge run`: all three in one process
)

// shutdownTimeout bounds each step of Close (the ops server's drain, the
// final span export), so a dead collector cannot hold up an exit.
const shutdownTimeout = 5 * time.Second

// runtime is what every long-running command shares: logger, database pool,
// tracing, metrics and the ops HTTP server (/healthz, /readyz, /metrics).
type runtime struct {
	Logger *slog.Logger
	Pool   *pgxpool.Pool
	// TracerProvider is the OTel SDK configured from OTEL_* (also installed
	// as otel's global), or the no-op provider when no endpoint is set.
	// Pass it explicitly to every component (REFERENCE "OpenTelemetry
	// traps").
	TracerProvider trace.TracerProvider
	// RelayMetrics goes into relay.Config.Metrics; nil unless the command
	// runs the relay.
	RelayMetrics relay.Metrics
	// DeliveryMetrics is the delivery engine's hook (see
	// docs/observability.md); set only when the command runs the
	// deliverer.
	DeliveryMetrics metrics.Deliveries
	// Metrics owns the meter provider and the Prometheus registry.
	Metrics *metrics.Metrics
	// Ops is the ops HTTP server; nil when HTTP_ADDR is empty. Other
	// handlers (the admin API) mount on it with Ops.Handle.
	Ops *opsserver.Server

	tracer  *tracing.Provider
	closers []func()
}

// runtimeOptions are test seams; the zero value is what commands get.
type runtimeOptions struct {
	// getenv reads the OTEL_* variables. nil: os.Getenv.
	getenv func(string) string
	// logger replaces the stderr logger.
	logger *slog.Logger
	// refresh is the metrics gauges' refresh interval. 0: the default.
	refresh time.Duration
	// noGlobals leaves otel's global providers alone (parallel tests).
	noGlobals bool
}

func startRuntime(ctx context.Context, cfg *config.Config, service string) (*runtime, error) {
	return startRuntimeWith(ctx, cfg, service, runtimeOptions{})
}

// startRuntimeWith sets up, in order: tracing from OTEL_* (service name per
// command), the database pool (schema checked), metrics with the gauges the
// command's data calls for, a Kafka client for readiness pings, and the ops
// HTTP server. Close undoes them in reverse, so the spans of the last events
// are flushed after everything else stopped.
func startRuntimeWith(ctx context.Context, cfg *config.Config, service string, opts runtimeOptions) (_ *runtime, err error) {
	logger := opts.logger
	if logger == nil {
		logger = newLogger(cfg)
	}
	logger = logger.With("service", service)
	rt := &runtime{Logger: logger}
	defer func() {
		if err != nil {
			rt.Close()
		}
	}()

	tcfg, err := tracing.ConfigFromEnv(opts.getenv, service)
	if err != nil {
		return nil, err
	}
	if opts.noGlobals {
		rt.tracer, err = tracing.New(ctx, tcfg)
	} else {
		// Export failures (a collector that is down) reach the log as
		// warnings instead of otel's default: the standard library logger.
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			logger.Warn("opentelemetry", "error", err)
		}))
		rt.tracer, err = tracing.Setup(ctx, tcfg)
	}
	if err != nil {
		return nil, err
	}
	rt.TracerProvider = rt.tracer.TracerProvider
	rt.closers = append(rt.closers, func() {
		if err := rt.tracer.Shutdown(context.Background()); err != nil {
			logger.Warn("spans lost at exit", "error", err)
		}
	})
	if rt.tracer.Exporting() {
		logger.InfoContext(ctx, "exporting traces", "endpoint", tcfg.Endpoint, "protocol", tcfg.Protocol, "service_name", tcfg.ServiceName)
	}

	rt.Pool, err = openCurrentDB(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rt.closers = append(rt.closers, rt.Pool.Close)

	res, err := tracing.NewResource(ctx, tcfg.ServiceName)
	if err != nil {
		return nil, err
	}
	getenv := opts.getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	mopts := metrics.Options{Resource: res, Logger: logger, RefreshInterval: opts.refresh}
	otlpMetrics, err := metrics.OTLPReader(ctx, getenv)
	if err != nil {
		return nil, err
	}
	if otlpMetrics != nil {
		mopts.Readers = append(mopts.Readers, otlpMetrics)
	}
	rt.Metrics, err = metrics.New(mopts)
	if err != nil {
		return nil, err
	}
	rt.closers = append(rt.closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if err := rt.Metrics.Shutdown(sctx); err != nil {
			logger.Warn("metrics shutdown", "error", err)
		}
	})
	if !opts.noGlobals {
		// otelhttp (the webhook client) and kotel record into the global
		// meter provider unless given one: their series land on /metrics
		// too (http_client_request_duration_seconds, …).
		otel.SetMeterProvider(rt.Metrics.MeterProvider())
	}
	// Only the stages this command runs: their series are exported at 0
	// from the start, and a relay's /metrics should not show a deliverer's.
	needs := needsOf(service)
	if needs.outbox {
		rt.RelayMetrics = rt.Metrics.Relay()
	}
	if needs.deliveries {
		rt.DeliveryMetrics = rt.Metrics.Deliveries()
	}
	if needs.outbox {
		if err := rt.observe(rt.Metrics.ObserveOutbox(rt.Pool)); err != nil {
			return nil, err
		}
	}
	if needs.deliveries {
		if err := rt.observe(rt.Metrics.ObserveDeliveries(rt.Pool)); err != nil {
			return nil, err
		}
	}

	checks := []opsserver.Check{
		{Name: "running", Run: func(context.Context) error {
			// A replica draining after SIGTERM is alive but should be
			// taken out of rotation.
			if ctx.Err() != nil {
				return errors.New("shutting down")
			}
			return nil
		}},
		opsserver.PostgresCheck(rt.Pool),
		opsserver.SchemaCheck(rt.Pool),
	}
	if needs.kafka && len(cfg.Kafka.Brokers) > 0 {
		// A client of its own: a ping through the relay's or the
		// consumer's client would queue behind their produce and fetch
		// requests and report their backlog as an outage.
		kopts, err := kafkaclient.Options(cfg.Kafka, nil)
		if err != nil {
			return nil, err
		}
		pinger, err := kgo.NewClient(kopts...)
		if err != nil {
			return nil, err
		}
		rt.closers = append(rt.closers, pinger.Close)
		checks = append(checks, opsserver.KafkaCheck(pinger.Ping))
	}

	if cfg.HTTP.Addr == "" && cfg.HTTP.AdminToken != "" {
		// Set for a reason, ignored without a word: the operator would look
		// for an API that is not there.
		logger.Warn("ADMIN_TOKEN is set but HTTP_ADDR=off: the admin API is not served", "variable", "ADMIN_TOKEN")
	}
	if cfg.HTTP.Addr != "" {
		rt.Ops = opsserver.New(opsserver.Config{
			Addr:    cfg.HTTP.Addr,
			Metrics: rt.Metrics.Handler(),
			Checks:  checks,
			Logger:  logger,
		})
		// The admin API (only with ADMIN_TOKEN set), mounted before Start.
		acfg := adminapi.FromConfig(cfg, rt.Pool, logger)
		acfg.Metrics = rt.Metrics.Admin()
		adminapi.Mount(rt.Ops, acfg)
		// The console under /ui/, with the same token.
		ccfg := console.FromConfig(cfg, rt.Pool, logger)
		ccfg.AuthMetrics = acfg.Metrics
		ui, err := console.Mount(rt.Ops, ccfg)
		if err != nil {
			return nil, err
		}
		if ui != nil {
			rt.closers = append(rt.closers, ui.Close)
		}
		if err := rt.Ops.Start(); err != nil {
			return nil, err
		}
		rt.closers = append(rt.closers, func() {
			sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
			defer cancel()
			if err := rt.Ops.Shutdown(sctx); err != nil {
				logger.Warn("ops server shutdown", "error", err)
			}
		})
	}
	return rt, nil
}

// serviceNeeds says which gauges and readiness checks a command's data
// calls for: the relay's replicas report the outbox, the deliverers the
// deliveries; `bridge run` does all.
type serviceNeeds struct{ outbox, deliveries, kafka bool }

func needsOf(service string) serviceNeeds {
	switch service {
	case serviceRelay:
		return serviceNeeds{outbox: true, kafka: true}
	case serviceConsume:
		return serviceNeeds{kafka: true}
	case serviceDeliver:
		return serviceNeeds{deliveries: true}
	case serviceAll:
		return serviceNeeds{outbox: true, deliveries: true, kafka: true}
	default:
		return serviceNeeds{kafka: true}
	}
}

// observe keeps the unregister function of a gauge registration for Close.
func (rt *runtime) observe(unregister func() error, err error) error {
	if err != nil {
		return err
	}
	rt.closers = append(rt.closers, func() { _ = unregister() })
	return nil
}

// ObserveConsumer exports c's counters and its group's lag per partition on
// /metrics until Close (or until c stops: call it after consumer.New).
func (rt *runtime) ObserveConsumer(c *consumer.Consumer, group string) error {
	return rt.observe(rt.Metrics.ObserveConsumer(c, group))
}

// Close releases everything in reverse order. Safe to call twice.
func (rt *runtime) Close() {
	closers := rt.closers
	rt.closers = nil
	for i := len(closers) - 1; i >= 0; i-- {
		closers[i]()
	}
}
