package cli

import (
	"context"
	"fmt"
	"slices"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/consumer"
	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/delivery/fastlane"
	"github.com/outboxbridge/bridge/internal/delivery/kafkawindow"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
	"github.com/outboxbridge/bridge/internal/progress"
	"github.com/outboxbridge/bridge/internal/relay"
	"github.com/outboxbridge/bridge/outbox/schema"
)

// stage is one long-running part of the bridge as the command layer sees
// it: what it needs from the environment and the runtime, and how to build
// it. `bridge relay`, `consume` and `deliver` run one stage; `bridge run`
// runs the list of all three in one process (runStages).
type stage struct {
	// name prefixes the stage's error when several run together.
	name string
	// needs is what the stage's configuration must contain.
	needs config.Needs
	// uses is what the shared runtime provides for it: gauges over the
	// outbox or the deliveries, a Kafka readiness check.
	uses serviceNeeds
	// validate checks settings config.Load cannot (before any connection,
	// so a bad value exits 2). nil: nothing more.
	validate func(*config.Config) error
	// build makes the stage on the runtime; close releases what build
	// opened beyond the stage itself (nil: nothing).
	build func(*config.Config, *runtime) (run func(context.Context) error, close func(), err error)
}

var relayStage = stage{
	name:  "relay",
	needs: config.CommandNeeds["relay"],
	uses:  serviceNeeds{outbox: true, kafka: true},
	build: func(cfg *config.Config, rt *runtime) (func(context.Context) error, func(), error) {
		r, closeRelay, err := newRelay(cfg, rt)
		if err != nil {
			return nil, nil, err
		}
		return r.Run, closeRelay, nil
	},
}

var consumeStage = stage{
	name:  "consume",
	needs: config.CommandNeeds["consume"],
	uses:  serviceNeeds{kafka: true},
	validate: func(cfg *config.Config) error {
		return consumer.ValidateTopics(cfg.Consumer.Topics)
	},
	build: func(cfg *config.Config, rt *runtime) (func(context.Context) error, func(), error) {
		c, err := newConsumer(cfg, rt)
		if err != nil {
			return nil, nil, err
		}
		// Run closes the consumer; Close is safe twice, for a stage whose
		// sibling failed to build before Run.
		return c.Run, c.Close, nil
	},
}

var deliverStage = stage{
	name:  "deliver",
	needs: config.CommandNeeds["deliver"],
	uses:  serviceNeeds{deliveries: true},
	validate: func(cfg *config.Config) error {
		if !cfg.Webhook.FastLane {
			return nil
		}
		return consumer.ValidateTopics(cfg.Consumer.Topics)
	},
	build: func(cfg *config.Config, rt *runtime) (func(context.Context) error, func(), error) {
		d, err := newDeliverer(cfg, rt)
		if err != nil {
			return nil, nil, err
		}
		if !cfg.Webhook.FastLane {
			return d.Run, nil, nil
		}
		l, err := newFastLane(cfg, rt)
		if err != nil {
			return nil, nil, err
		}
		// The slow lane (bridge.deliveries) and the fast lane (the
		// partitions this member owns) side by side.
		return func(ctx context.Context) error {
			g, gctx := errgroup.WithContext(ctx)
			g.Go(func() error { return d.Run(gctx) })
			g.Go(func() error { return l.Run(gctx) })
			return g.Wait()
		}, nil, nil
	},
}

// allStages is `bridge run`.
var allStages = []stage{relayStage, consumeStage, deliverStage}

// needsOf is the union of the stages' needs.
func needsOf(stages []stage) (config.Needs, serviceNeeds) {
	var n config.Needs
	var u serviceNeeds
	for _, s := range stages {
		n.Database = n.Database || s.needs.Database
		n.Kafka = n.Kafka || s.needs.Kafka
		n.Topics = n.Topics || s.needs.Topics
		n.Secrets = n.Secrets || s.needs.Secrets
		n.Delivers = n.Delivers || s.needs.Delivers
		n.FanOut = n.FanOut || s.needs.FanOut
		u.outbox = u.outbox || s.uses.outbox
		u.deliveries = u.deliveries || s.uses.deliveries
		u.kafka = u.kafka || s.uses.kafka
	}
	if len(stages) > 1 {
		// `bridge run` leaves the fan-out out under the fast lane
		// (withoutConsume); only `bridge consume` itself is refused.
		n.FanOut = false
	}
	return n, u
}

// runStages is every long-running command: load and check the
// configuration the stages need, start the shared runtime (waiting for
// PostgreSQL and Kafka), build the stages and run them until ctx ends or
// one fails — then the others are stopped too.
func runStages(ctx context.Context, service string, stages ...stage) error {
	needs, uses := needsOf(stages)
	cfg, err := loadConfig(needs)
	if err != nil {
		return err
	}
	stages = withoutConsume(cfg, stages)
	if cfg.Webhook.FastLane && slices.ContainsFunc(stages, func(s stage) bool { return s.name == deliverStage.name }) {
		// The fast lane reads the topics: the deliverer waits for Kafka
		// and reports it on /readyz, as the consumer does.
		uses.kafka = true
	}
	for _, s := range stages {
		if s.validate != nil {
			if err := s.validate(cfg); err != nil {
				return err
			}
		}
	}
	rt, err := startRuntime(ctx, cfg, service, uses)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for dependencies: nothing ran
		}
		return err
	}
	defer rt.Close()
	return runBuilt(ctx, cfg, rt, stages)
}

// withoutConsume drops the consume stage from a list of several when the
// fast lane reads the topics (`bridge run` with WEBHOOK_FAST_LANE).
func withoutConsume(cfg *config.Config, stages []stage) []stage {
	if !cfg.Webhook.FastLane || len(stages) < 2 {
		return stages
	}
	out := make([]stage, 0, len(stages))
	for _, s := range stages {
		if s.name != consumeStage.name {
			out = append(out, s)
		}
	}
	return out
}

// runBuilt builds the stages on rt and runs them together.
func runBuilt(ctx context.Context, cfg *config.Config, rt *runtime, stages []stage) error {
	runs := make([]func(context.Context) error, len(stages))
	for i, s := range stages {
		run, closeFn, err := s.build(cfg, rt)
		if err != nil {
			return prefix(len(stages), s.name, err)
		}
		if closeFn != nil {
			defer closeFn()
		}
		runs[i] = run
	}
	if len(stages) == 1 {
		return runs[0](ctx)
	}
	g, gctx := errgroup.WithContext(ctx)
	for i, s := range stages {
		g.Go(func() error { return prefix(len(stages), s.name, runs[i](gctx)) })
	}
	return g.Wait()
}

// prefix names the stage in an error when several run in one process.
func prefix(n int, name string, err error) error {
	if err == nil || n == 1 {
		return err
	}
	return fmt.Errorf("%s: %w", name, err)
}

// newRelay builds the relay and its producer on the shared runtime. The
// returned func closes the producer.
func newRelay(cfg *config.Config, rt *runtime) (*relay.Relay, func(), error) {
	rc := relay.ConfigFromEnv(cfg.Relay)
	rc.Logger = rt.Logger
	rc.TracerProvider = rt.TracerProvider
	rc.Metrics = rt.RelayMetrics
	rc.OperationsTopic = cfg.Operations.Topic
	reg, err := newSchemaRegistry(cfg)
	if err != nil {
		return nil, nil, err
	}
	if reg != nil {
		rc.Values = reg
	}
	client, err := newProducer(cfg, rc)
	if err != nil {
		return nil, nil, err
	}
	return relay.New(rt.Pool, client, rc), client.Close, nil
}

// newSchemaRegistry is the registry that governs topics, nil when
// SCHEMA_REGISTRY_URL is unset.
func newSchemaRegistry(cfg *config.Config) (*schema.Registry, error) {
	if cfg.Schemas.URL == "" {
		return nil, nil
	}
	return schema.New(schema.Config{URL: cfg.Schemas.URL, RefreshInterval: cfg.Schemas.Refresh})
}

// valueDecoder reads schema-governed record values back to JSON for the
// webhook stages: the registry when SCHEMA_REGISTRY_URL is set (an
// Avro-governed topic needs it), nil otherwise.
func valueDecoder(cfg *config.Config) (contract.ValueDecoder, error) {
	reg, err := newSchemaRegistry(cfg)
	if err != nil || reg == nil {
		return nil, err
	}
	return reg, nil
}

// newProducer builds the relay's Kafka client.
func newProducer(cfg *config.Config, rc relay.Config) (*kgo.Client, error) {
	opts, err := kafkaclient.Options(cfg.Kafka, nil)
	if err != nil {
		return nil, err
	}
	return kgo.NewClient(append(opts, relay.ProducerOptions(rc)...)...)
}

// newConsumer builds the consumer from CONSUMER_* and the shared runtime
// (logger, pool, tracer provider).
func newConsumer(cfg *config.Config, rt *runtime) (*consumer.Consumer, error) {
	kopts, err := kafkaclient.Options(cfg.Kafka, rt.Logger)
	if err != nil {
		return nil, err
	}
	cc := consumer.ConfigFromEnv(cfg.Consumer)
	cc.Logger = rt.Logger
	cc.TracerProvider = rt.TracerProvider
	if cc.Values, err = valueDecoder(cfg); err != nil {
		return nil, err
	}
	c, err := consumer.New(rt.Pool, kopts, cc)
	if err != nil {
		return nil, err
	}
	// Counters and group lag on /metrics (internal/metrics).
	if err := rt.ObserveConsumer(c, cc.Group); err != nil {
		c.Close()
		return nil, err
	}
	if err := rt.watchProgress(cfg, &progress.Watch{
		Stage: "consume",
		Count: func() int64 { return c.Stats().Records },
		Waiting: func(context.Context) (string, error) {
			if n := c.Held(); n > 0 {
				return fmt.Sprintf("it holds %d polled records not stored yet", n), nil
			}
			return "", nil
		},
	}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// newDeliverer builds the webhook Deliverer from WEBHOOK_* and the shared
// runtime (pool, logger, tracer provider, metrics).
func newDeliverer(cfg *config.Config, rt *runtime) (*delivery.Deliverer, error) {
	dc, err := delivery.ConfigFromEnv(cfg.Webhook)
	if err != nil {
		return nil, err
	}
	dc.Logger = rt.Logger
	dc.TracerProvider = rt.TracerProvider
	dc.Metrics = rt.DeliveryMetrics
	dc.OperationsTopic = cfg.Operations.Topic
	dc.Keys = cfg.Secrets.Ring()
	if cfg.Webhook.FastLane {
		// Delivered events have no rows: history is read from the topics.
		values, err := valueDecoder(cfg)
		if err != nil {
			return nil, err
		}
		if dc.HistoryFromKafka, err = kafkawindow.SourceFromConfig(cfg, values, rt.Logger); err != nil {
			return nil, err
		}
	}
	d, err := delivery.NewDeliverer(rt.Pool, dc)
	if err != nil {
		return nil, err
	}
	if err := rt.watchProgress(cfg, &progress.Watch{Stage: "deliver", Count: d.Progress, Waiting: d.Waiting}); err != nil {
		return nil, err
	}
	return d, nil
}

// watchProgress puts w on /readyz (READY_STALL_TIMEOUT) and its stall on
// /metrics (bridge_stage_stalled_seconds).
func (rt *runtime) watchProgress(cfg *config.Config, w *progress.Watch) error {
	w.After = cfg.HTTP.ReadyStallTimeout
	if rt.Ops != nil {
		rt.Ops.AddCheck(w.Check())
	}
	return rt.observe(rt.Metrics.ObserveStall(w))
}

// newFastLane builds the deliverer's fast lane: a member of CONSUMER_GROUP
// on CONSUMER_TOPICS posting from memory (WEBHOOK_FAST_LANE).
func newFastLane(cfg *config.Config, rt *runtime) (*fastlane.Lane, error) {
	kopts, err := kafkaclient.Options(cfg.Kafka, rt.Logger)
	if err != nil {
		return nil, err
	}
	dc, err := delivery.ConfigFromEnv(cfg.Webhook)
	if err != nil {
		return nil, err
	}
	values, err := valueDecoder(cfg)
	if err != nil {
		return nil, err
	}
	l, err := fastlane.New(rt.Pool, kopts, fastlane.Config{
		Values: values,
		Group:  cfg.Consumer.Group, Topics: cfg.Consumer.Topics,
		Workers: dc.Workers, MaxInFlightPerSubscription: dc.MaxInFlightPerSubscription, Timeout: dc.Timeout,
		RetrySchedule: dc.RetrySchedule, AttemptRetention: dc.Retention, ShutdownGrace: dc.ShutdownGrace,
		SessionTimeout: cfg.Consumer.SessionTimeout, RebalanceTimeout: cfg.Consumer.RebalanceTimeout,
		Keys: cfg.Secrets.Ring(), AllowedCIDRs: dc.AllowedCIDRs,
		MaxWaiting: cfg.Webhook.FastLaneMaxWaiting, MaxWaitingBytes: cfg.Webhook.FastLaneMaxWaitingBytes,
		MaxWaitingAge: cfg.Webhook.FastLaneMaxWaitingAge, InFlightLimit: cfg.Webhook.FastLaneInFlightLimit,
		TracerProvider: rt.TracerProvider, Logger: rt.Logger, Metrics: rt.DeliveryMetrics,
	})
	if err != nil {
		return nil, err
	}
	if err := rt.observe(rt.Metrics.ObserveFastLane(l, cfg.Consumer.Group)); err != nil {
		return nil, err
	}
	if err := rt.watchProgress(cfg, &progress.Watch{Stage: "fast_lane", Count: l.Progress, Waiting: l.Waiting}); err != nil {
		return nil, err
	}
	return l, nil
}

// stageCommand is one of the commands that run stages (relay, consume,
// deliver, run): they differ only in their help and in which stages they
// run, so they are built in one place and cannot drift apart in their group,
// their arguments or how they start.
type stageCommand struct {
	use, short, long, example string
	service                   string
	stages                    []stage
}

func registerStage(sc stageCommand) {
	register(func() *cobra.Command {
		return &cobra.Command{
			Use:     sc.use,
			GroupID: groupRun,
			Short:   sc.short,
			Long:    sc.long,
			Example: sc.example,
			Args:    cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return runStages(cmd.Context(), sc.service, sc.stages...)
			},
		}
	})
}
