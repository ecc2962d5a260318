package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/adminapi"
	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/console"
	"github.com/outboxbridge/bridge/internal/consumer"
	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
	"github.com/outboxbridge/bridge/internal/keyring"
	"github.com/outboxbridge/bridge/internal/metrics"
	"github.com/outboxbridge/bridge/internal/opsserver"
	"github.com/outboxbridge/bridge/internal/relay"
	"github.com/outboxbridge/bridge/internal/service"
	"github.com/outboxbridge/bridge/internal/tracing"
)

// Service names: the default OTEL_SERVICE_NAME (and the log's "service") of
// each long-running command.
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
	// connectOnce makes one connection attempt to PostgreSQL and Kafka
	// instead of waiting up to DATABASE_CONNECT_TIMEOUT (the demo, which
	// checked both just before).
	connectOnce bool
}

func startRuntime(ctx context.Context, cfg *config.Config, service string, uses serviceNeeds) (*runtime, error) {
	return startRuntimeWith(ctx, cfg, service, uses, runtimeOptions{})
}

// startRuntimeWith sets up, in order: tracing from OTEL_* (service name per
// command), the database pool (not connected yet), metrics with the gauges
// the stages' data calls for (uses), a Kafka client for readiness pings, and
// the ops HTTP server; then it waits for PostgreSQL (schema checked) and
// Kafka (waitForDependencies), with /healthz up and /readyz not ready
// meanwhile. Close undoes them in reverse, so the spans of the last events
// are flushed after everything else stopped.
func startRuntimeWith(ctx context.Context, cfg *config.Config, service string, uses serviceNeeds, opts runtimeOptions) (_ *runtime, err error) {
	logger := opts.logger
	if logger == nil {
		logger = newLogger(cfg)
	}
	logger = logger.With("service", service)
	// The deliverer signs with the stored secrets; the admin API and the
	// console (served with ADMIN_TOKEN) create and rotate them.
	usesSecrets := uses.deliveries || (cfg.HTTP.Addr != "" && cfg.HTTP.AdminToken != "")
	if usesSecrets {
		// config.Load refuses deliver and run already (Needs.Secrets); a
		// process serving the admin API is known only here.
		what := "the deliverer"
		if !uses.deliveries {
			what = "the admin API (ADMIN_TOKEN is set)"
		}
		if err := cfg.Secrets.Require(what); err != nil {
			return nil, err
		}
	}
	rt := &runtime{Logger: logger}
	if !opts.noGlobals {
		if pct, set := applyGCPercent(os.Getenv); set {
			logger.Debug("garbage collector target", "gogc", pct)
		}
	}
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

	// The pool connects lazily: the ops server comes up first, and
	// waitForDependencies makes the first connection.
	var dbAddr string
	rt.Pool, dbAddr, err = database.Open(cfg.Database)
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
	rt.closers = append(rt.closers, shutdownWithin(logger, "metrics shutdown", rt.Metrics.Shutdown))
	if !opts.noGlobals {
		// otelhttp (the webhook client) and kotel record into the global
		// meter provider unless given one: their series land on /metrics
		// too (http_client_request_duration_seconds, …).
		otel.SetMeterProvider(rt.Metrics.MeterProvider())
	}
	// Only the stages this command runs: their series are exported at 0
	// from the start, and a relay's /metrics should not show a deliverer's.
	needs := uses
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
	var pinger *kgo.Client
	if needs.kafka && len(cfg.Kafka.Brokers) > 0 {
		// A client of its own: a ping through the relay's or the
		// consumer's client would queue behind their produce and fetch
		// requests and report their backlog as an outage.
		kopts, err := kafkaclient.Options(cfg.Kafka, nil)
		if err != nil {
			return nil, err
		}
		pinger, err = kgo.NewClient(kopts...)
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
		ccfg.Metrics = acfg.Metrics
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
		rt.closers = append(rt.closers, shutdownWithin(logger, "ops server shutdown", rt.Ops.Shutdown))
	}
	if err := rt.waitForDependencies(ctx, cfg, dbAddr, pinger, opts.connectOnce); err != nil {
		return nil, err
	}
	if usesSecrets {
		if err := checkSecretKeys(ctx, cfg, rt.Pool, logger); err != nil {
			return nil, err
		}
	}
	return rt, nil
}

// checkSecretKeys is the start-up check of a process that uses signing
// secrets: every stored secret must open under BRIDGE_SECRET_KEYS (each key
// id in use present, and the right key under it: its oldest secret is
// opened), else it refuses to start, naming the key, instead of failing
// each of that key's deliveries later. It warns, each start, when secrets
// are or will be stored in plain text, or under the published dev key.
func checkSecretKeys(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, logger *slog.Logger) error {
	ring := cfg.Secrets.Ring()
	kc, err := store.CheckKeys(ctx, pool, ring)
	var ke *keyring.KeyError
	if errors.As(err, &ke) {
		return &config.Error{Var: keyring.Var, Problem: err.Error()}
	}
	if err != nil {
		return err
	}
	if ring == nil {
		logger.Warn("BRIDGE_ALLOW_PLAINTEXT_SECRETS=true and no BRIDGE_SECRET_KEYS: webhook signing secrets are stored in plain text; "+
			"anyone who can read the database or a backup can forge webhooks (set BRIDGE_SECRET_KEYS, then run bridge secrets rotate-key)",
			"variable", "BRIDGE_ALLOW_PLAINTEXT_SECRETS", "plaintext_secrets", kc.Plaintext)
		return nil
	}
	if dev := ring.DevKeyIDs(); len(dev) > 0 {
		logger.Warn("BRIDGE_SECRET_KEYS holds the published development key: anyone can decrypt the secrets sealed under it (not for production)",
			"variable", keyring.Var, "key_ids", strings.Join(dev, ","))
	}
	if kc.Plaintext > 0 {
		logger.Warn("signing secrets stored in plain text: run bridge secrets rotate-key to encrypt them",
			"plaintext_secrets", kc.Plaintext, "key_id", ring.CurrentID())
	}
	return nil
}

// waitForDependencies makes the first connections: PostgreSQL (with the
// schema this binary needs), then a Kafka broker when the stages use one.
// A long-running command started while either is down (a database
// failover, a broker restart, a deploy that starts everything at once)
// retries with capped backoff for up to DATABASE_CONNECT_TIMEOUT (0:
// forever) instead of exiting into its supervisor's restart loop; each kind
// of failure is logged once per interval. The ops server is already up:
// /healthz answers, /readyz says which dependency is missing.
func (rt *runtime) waitForDependencies(ctx context.Context, cfg *config.Config, dbAddr string, pinger *kgo.Client, once bool) error {
	timeout := cfg.Database.ConnectTimeout
	if once {
		timeout = time.Nanosecond // the first failure is final
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	remaining := func() time.Duration {
		if deadline.IsZero() {
			return 0
		}
		return max(time.Until(deadline), time.Nanosecond)
	}
	wait := func(name string) service.Wait {
		return service.Wait{
			Name:           name,
			Timeout:        remaining(),
			AttemptTimeout: database.AttemptTimeout(cfg.Database),
			Backoff:        service.Backoff{Base: 250 * time.Millisecond, Max: 5 * time.Second},
			LogEvery:       30 * time.Second,
			Logger:         rt.Logger,
		}
	}
	pgWait := wait("connect to PostgreSQL at " + dbAddr)
	pgWait.Permanent = database.IsAuthFailure // a wrong password is not an outage
	err := service.Retry(ctx, pgWait, func(ctx context.Context) error {
		if err := database.Ping(ctx, rt.Pool, dbAddr, database.AttemptTimeout(cfg.Database)); err != nil {
			return err
		}
		return database.CheckCurrent(ctx, rt.Pool)
	})
	if err != nil {
		return unwrapWait(err)
	}
	if pinger == nil {
		return nil
	}
	brokers := strings.Join(cfg.Kafka.Brokers, ",")
	err = service.Retry(ctx, wait("connect to Kafka at "+brokers), func(ctx context.Context) error {
		if err := pinger.Ping(ctx); err != nil {
			return fmt.Errorf("cannot reach a Kafka broker at %s: %w", brokers, err)
		}
		return nil
	})
	return unwrapWait(err)
}

// unwrapWait returns the last failure of a Retry that gave up, so the
// command's one-line error is the failure itself ("cannot connect to
// PostgreSQL at …"), as it was before commands waited.
func unwrapWait(err error) error {
	if err == nil {
		return nil
	}
	var ce *database.ConnectError
	if errors.As(err, &ce) {
		return ce
	}
	if u := errors.Unwrap(err); u != nil && !errors.Is(err, context.Canceled) {
		return u
	}
	return err
}

// serviceNeeds says which gauges and readiness checks the stages' data
// calls for: the relay reports the outbox, the deliverer the deliveries, and
// the relay and the consumer need Kafka (each stage says so: stages.go).
type serviceNeeds struct{ outbox, deliveries, kafka bool }

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

// shutdownWithin is a closer that gives shutdown shutdownTimeout to finish
// (a stuck exporter or HTTP client must not hold the exit) and logs, as
// what, an error it returns.
func shutdownWithin(logger *slog.Logger, what string, shutdown func(context.Context) error) func() {
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			logger.Warn(what, "error", err)
		}
	}
}

// defaultGCPercent is the garbage collector's target (GOGC) of the
// long-running commands when GOGC is not set. Go's default of 100 starts a
// collection each time the heap has grown by as much as is live; the
// bridge's live heap is small (a few MiB: claims, connections, buffers)
// while every delivery allocates (the envelope, the request, the response),
// so at 3,000 webhooks/s it collected many times a second and the GC was a
// quarter of the process's CPU in `bench pipeline`. 400 lets the heap grow
// by four times the live heap between collections: a few tens of MiB more,
// still bounded by what is live (the claims out), for a fraction of the
// collections. GOGC, when set, wins (and GOMEMLIMIT works as documented).
const defaultGCPercent = 400

// applyGCPercent sets defaultGCPercent unless GOGC is set; it reports the
// percent set and whether it set one.
func applyGCPercent(getenv func(string) string) (int, bool) {
	if getenv("GOGC") != "" {
		return 0, false
	}
	debug.SetGCPercent(defaultGCPercent)
	return defaultGCPercent, true
}
