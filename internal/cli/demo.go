package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/demo"
	"github.com/outboxbridge/bridge/internal/jaegerquery"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
	"github.com/outboxbridge/bridge/internal/keyring"
	"github.com/outboxbridge/bridge/internal/logging"
)

func init() { register(newDemoCmd) }

func newDemoCmd() *cobra.Command {
	var o demo.Options
	var keep bool
	c := &cobra.Command{
		Use:     "demo",
		GroupID: groupRun,
		Short:   "Run the whole pipeline on an embedded Kafka with a checking webhook receiver",
		Long: `demo runs relay, consume and deliver in one process (the wiring of 'bridge run')
against PostgreSQL and an embedded Kafka broker, plays an asset lifecycle
workload through it, and checks what arrives at a webhook receiver on loopback:
every Standard Webhooks signature verified with the subscription's secret,
asset_seq strictly increasing per asset, every event delivered except the one
poison event, which the relay parks as FAILED.

Needs only PostgreSQL: DATABASE_URL, default ` + demo.DefaultDatabaseURL + `
(make demo starts it). The schema is migrated. Kafka: KAFKA_BROKERS if set
(the run's topic and consumer group are deleted afterwards), else an embedded
broker on a loopback port, printed so kcat can read it. Each run has its own
topic (demo.assets.<run>), consumer group and subscription, removed at the end
(--keep leaves the subscription disabled, with its delivery log).

The receiver answers 500 to the first attempt of the third event of
--refusals assets: with the fast lane (WEBHOOK_FAST_LANE, the default)
those streams park, are retried from bridge.deliveries (the slow lane) and
come back to the fast lane; the summary counts both lanes.
WEBHOOK_FAST_LANE=false runs the row engine instead.

The demo sets, unless the environment does: RELAY_POLL_INTERVAL and
WEBHOOK_POLL_INTERVAL 100ms, RELAY_MAX_MESSAGE_BYTES 65536 (the poison event is
larger), WEBHOOK_RETRY_SCHEDULE 0s,1s,2s, WEBHOOK_MAX_IN_FLIGHT_PER_SUBSCRIPTION
32 (its one subscription has every asset), DATABASE_MAX_CONNS 20, HTTP_ADDR empty
(no ops server); and always WEBHOOK_ALLOW_HTTP=true and 127.0.0.0/8 in
WEBHOOK_ALLOWED_CIDRS for its receiver. The pipeline's logs go to a file named
in the header. With OTEL_EXPORTER_OTLP_ENDPOINT set, the summary names a trace
to look up in Jaeger.

It refuses a database where its relay would take other applications' events:
NEW outbox rows of non-demo topics, or (with the embedded broker) relay
replicas already running.

Ctrl-C stops it at any moment with the summary so far. Exit status 1 when any
order violation, signature failure or undelivered event was seen.`,
		Example: `  make demo                              # starts PostgreSQL, then: go run ./cmd/bridge demo
  bridge demo --events 10000 --rate 1000 --assets 200
  bridge demo --duration 30s --rate 50   # a slow run to watch with kcat
  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 bridge demo   # then open the printed trace
  KAFKA_BROKERS=127.0.0.1:9092 bridge demo -o json`,
		Args: cobra.NoArgs,
	}
	f := c.Flags()
	f.IntVar(&o.Events, "events", demo.DefaultEvents, "events to enqueue (at least 20)")
	f.IntVar(&o.Assets, "assets", demo.DefaultAssets, "assets the events are spread over (at most events/4)")
	f.Float64Var(&o.Rate, "rate", demo.DefaultRate, "events per second; -1: as fast as possible")
	f.DurationVar(&o.Duration, "duration", 0, "stop enqueueing after this long (0: when --events are enqueued)")
	f.DurationVar(&o.Timeout, "timeout", demo.DefaultTimeout, "how long to wait for the last deliveries after the workload")
	f.IntVar(&o.Refusals, "refusals", demo.DefaultRefusals, "assets whose third event the receiver refuses once (500), to show a retry; -1: none")
	f.BoolVar(&keep, "keep", false, "keep the run's subscription (disabled) and its deliveries, and the topic on a real broker")
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		if o.Rate == 0 {
			return UsageErrorf("--rate must be positive, or -1 for as fast as possible")
		}
		if o.Timeout == 0 {
			return UsageErrorf("--timeout must be positive")
		}
		if err := o.Validate(); err != nil {
			return usageError{err}
		}
		o.Keep = keep
		stdout := cmd.OutOrStdout()
		o.Out = stdout
		switch {
		case out == "json":
			o.Progress = demo.ProgressNone
		case isTerminal(stdout):
			o.Progress = demo.ProgressBar
		default:
			o.Progress = demo.ProgressLines
		}
		sum, err := RunDemo(cmd.Context(), DemoParams{Options: o})
		if sum == nil && cmd.Context().Err() != nil {
			// Ctrl-C before the pipeline started: nothing to summarise, and
			// nothing went wrong.
			fmt.Fprintln(cmd.ErrOrStderr(), "bridge demo: interrupted before the pipeline started")
			return nil
		}
		if sum != nil {
			var perr error
			if out == "json" {
				perr = printJSON(stdout, sum)
			} else {
				perr = sum.Print(stdout)
			}
			if err == nil {
				err = perr
			}
		}
		if err != nil {
			return err
		}
		return sum.Err()
	})
	return c
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// DemoParams configure RunDemo.
type DemoParams struct {
	// Env is the environment the demo reads its configuration from (nil:
	// the process's). The demo's own settings are applied on top of it.
	Env map[string]string
	// Options are the command's flags.
	Options demo.Options
	// Logger receives the pipeline's logs. nil: a log file in the temporary
	// directory, named in the header.
	Logger *slog.Logger
	// Isolated leaves OpenTelemetry's global providers alone, so several
	// demos can run in one process (tests).
	Isolated bool
}

// RunDemo is `bridge demo` without its command line: it configures, migrates,
// starts the broker (embedded unless KAFKA_BROKERS is set) and the runtime of
// `bridge run`, runs demo.Run with allStages as the pipeline, and cleans up. The
// tests of package demo run the whole pipeline through it. A configuration
// error is a *config.Error (exit 2).
func RunDemo(ctx context.Context, p DemoParams) (*demo.Summary, error) {
	environ := p.Env
	if environ == nil {
		environ = processEnv()
	}
	runID := demo.NewRunID()
	topic := demo.Topic(runID)
	group := "bridge-demo-" + runID
	env := demoEnv(environ, topic, group)
	_, userDB := environ["DATABASE_URL"]
	userDB = userDB && environ["DATABASE_URL"] != ""

	cfg, err := config.Load(env, config.Needs{Database: true, Topics: true, Secrets: true})
	if err != nil {
		return nil, err
	}
	if environ["HTTP_ADDR"] == "" {
		// No ops server unless asked for: port 8080 may well be taken, and
		// a demo should not fail on it.
		cfg.HTTP.Addr = ""
	}

	// Logs: to the caller's logger, or to a file so they do not tear the
	// progress display.
	logger, logFile := p.Logger, ""
	if logger == nil {
		logFile = filepath.Join(os.TempDir(), "bridge-demo-"+runID+".log")
		f, err := os.Create(logFile)
		if err != nil {
			return nil, fmt.Errorf("demo log file: %w", err)
		}
		defer f.Close()
		logger = logging.New(f, cfg.Log.Level, cfg.Log.Format)
	}

	// Migrate, and make sure this database is one the demo may relay from
	// (else it moves to a scratch database next to it).
	embedded := len(cfg.Kafka.Brokers) == 0
	dbcfg, dbNote, err := demo.PrepareDatabase(ctx, cfg.Database, embedded, logger)
	if err != nil {
		var ce *database.ConnectError
		if errors.As(err, &ce) && !userDB {
			err = fmt.Errorf("%w (the demo's default database; start PostgreSQL with `make demo` or scripts/services-up.sh, or set DATABASE_URL)", err)
		}
		return nil, err
	}
	cfg.Database = dbcfg

	// Kafka: the embedded broker, or the run's topic on the real one.
	if embedded {
		cluster, err := demo.StartBroker(topic)
		if err != nil {
			return nil, err
		}
		defer cluster.Close()
		cfg.Kafka.Brokers = cluster.ListenAddrs()
	} else {
		kopts, err := kafkaclient.Options(cfg.Kafka, nil)
		if err != nil {
			return nil, err
		}
		if err := demo.CreateTopic(ctx, kopts, topic); err != nil {
			return nil, err
		}
		if !p.Options.Keep {
			defer func() {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
				defer cancel()
				if err := demo.RemoveTopic(cctx, kopts, topic, group); err != nil {
					logger.Warn("demo topic left on the broker", "topic", topic, "error", err)
				}
			}()
		}
	}

	_, uses := needsOf(allStages)
	rt, err := startRuntimeWith(ctx, cfg, serviceAll, uses, runtimeOptions{
		getenv:      func(k string) string { return env[k] },
		logger:      logger,
		noGlobals:   p.Isolated,
		connectOnce: true,
	})
	if err != nil {
		return nil, err
	}
	defer rt.Close()

	sum, err := demo.Run(ctx, demo.Env{
		Pool:            rt.Pool,
		Subscriptions:   subscriptionStore(cfg, rt.Pool),
		Pipeline:        func(ctx context.Context) error { return runBuilt(ctx, cfg, rt, withoutConsume(cfg, allStages)) },
		FastLane:        cfg.Webhook.FastLane,
		TracerProvider:  rt.TracerProvider,
		Exporting:       rt.tracer.Exporting(),
		TraceText:       traceText(rt, cfg.HTTP.JaegerQueryURL),
		Topic:           topic,
		RunID:           runID,
		Brokers:         cfg.Kafka.Brokers,
		EmbeddedBroker:  embedded,
		MaxMessageBytes: cfg.Relay.MaxMessageBytes,
		Logger:          logger,
		Database:        config.RedactURL(cfg.Database.URL),
		DatabaseNote:    dbNote,
		LogFile:         logFile,
	}, p.Options)
	if err != nil && logFile != "" {
		err = fmt.Errorf("%w (logs: %s)", err, logFile)
	}
	return sum, err
}

// demoEnv is the environment the demo runs with: the caller's, plus the
// demo's defaults where the caller set nothing, plus what the demo needs
// whatever the caller set (its own topic and group, a receiver on loopback
// over plain http).
func demoEnv(environ map[string]string, topic, group string) map[string]string {
	env := maps.Clone(environ)
	def := func(k, v string) {
		if env[k] == "" {
			env[k] = v
		}
	}
	def("DATABASE_URL", demo.DefaultDatabaseURL)
	def("DATABASE_MAX_CONNS", "20")
	if env["BRIDGE_ALLOW_PLAINTEXT_SECRETS"] == "" {
		// The published development key (start-up warns about it): the
		// demo's secrets are sealed as in production, with a key that is
		// no secret.
		def(keyring.Var, keyring.DevKeys)
	}
	def("RELAY_POLL_INTERVAL", "100ms")
	def("RELAY_MAX_MESSAGE_BYTES", fmt.Sprint(demo.DefaultMaxMessageBytes))
	def("WEBHOOK_POLL_INTERVAL", "100ms")
	def("WEBHOOK_RETRY_SCHEDULE", "0s,1s,2s")
	// One subscription with dozens of asset streams: let it use every
	// worker, not the default 8 (a multi-tenant guard the demo has no use for).
	def("WEBHOOK_MAX_IN_FLIGHT_PER_SUBSCRIPTION", "32")
	def("OTEL_SERVICE_NAME", "outbox-bridge-demo")
	// Where scripts/services-up.sh serves Jaeger's query API: the summary
	// draws the sample trace from it.
	def("JAEGER_QUERY_URL", demo.JaegerQuery)
	env["CONSUMER_TOPICS"] = topic
	env["CONSUMER_GROUP"] = group
	env["WEBHOOK_ALLOW_HTTP"] = "true"
	cidrs := strings.Trim(env["WEBHOOK_ALLOWED_CIDRS"], ", ")
	if cidrs != "" {
		cidrs += ","
	}
	env["WEBHOOK_ALLOWED_CIDRS"] = cidrs + "127.0.0.0/8"
	return env
}

func processEnv() map[string]string {
	env := make(map[string]string)
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}

// traceText flushes the spans, then reads the trace back from Jaeger's
// query API until the spans of every stage are there (export is
// asynchronous; Jaeger indexes a moment later) and draws it as text.
func traceText(rt *runtime, queryURL string) func(context.Context, string) (string, error) {
	if queryURL == "" {
		return nil
	}
	jq := jaegerquery.New(queryURL)
	return func(ctx context.Context, traceID string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		var last error
		for {
			if err := rt.tracer.ForceFlush(ctx); err != nil {
				return "", fmt.Errorf("flush spans: %w", err)
			}
			tr, err := jq.Get(ctx, traceID)
			if err == nil && tr.Complete() {
				return tr.Text(48), nil
			}
			if err != nil {
				last = err
			} else {
				last = fmt.Errorf("Jaeger has %d spans of the trace, not yet every stage", len(tr.Spans))
			}
			select {
			case <-ctx.Done():
				if err == nil && tr != nil {
					return tr.Text(48), nil // what there is
				}
				return "", last
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
}
