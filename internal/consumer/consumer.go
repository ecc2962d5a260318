package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/logging"
	"github.com/outboxbridge/bridge/internal/service"
	"github.com/outboxbridge/bridge/internal/topicname"
	"github.com/outboxbridge/bridge/internal/tracing"
	"github.com/outboxbridge/bridge/internal/version"
)

// Consumer is `bridge consume`: one member of the consumer group. Create it
// with New and run it with Run (once).
type Consumer struct {
	cfg    Config
	pool   *pgxpool.Pool
	client *kgo.Client // group consumer
	dlq    *kgo.Client // dead-letter producer
	tracer trace.Tracer
	logger *slog.Logger

	stats     counters
	held      atomic.Int64 // records polled and not yet finished (Held)
	started   atomic.Bool
	closeOnce sync.Once

	// beforeCommit, when set (tests), runs after a batch is stored and before
	// its offsets are committed; an error makes Run return it at once without
	// committing, like a crash at that point.
	beforeCommit func([]*kgo.Record) error
	// parse, when set (tests), replaces parse: a test that reaches a
	// PostgreSQL refusal Decode's bounds otherwise stop first.
	parse func(*kgo.Record) *event
}

// New builds a consumer from the pool, the shared Kafka connection options
// (kafkaclient.Options) and cfg. It does not connect yet.
func New(pool *pgxpool.Pool, kafkaOpts []kgo.Opt, cfg Config) (*Consumer, error) {
	if pool == nil {
		return nil, errors.New("consumer: nil database pool")
	}
	cfg = cfg.withDefaults()
	if len(cfg.Topics) == 0 {
		return nil, &config.Error{Var: "CONSUMER_TOPICS", Problem: "is required (comma-separated topic list)"}
	}
	if cfg.GroupProtocol != "classic" && cfg.GroupProtocol != "consumer" {
		return nil, &config.Error{Var: "CONSUMER_GROUP_PROTOCOL", Value: cfg.GroupProtocol, Problem: "must be classic or consumer"}
	}
	topicOpts, err := topicOptions(cfg.Topics)
	if err != nil {
		return nil, err
	}
	c := &Consumer{cfg: cfg, pool: pool, logger: cmpLogger(cfg.Logger)}
	c.logger = c.logger.With("component", "consumer", "group", cfg.Group)
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	c.tracer = tp.Tracer("github.com/outboxbridge/bridge/internal/consumer", trace.WithInstrumentationVersion(version.String()))

	opts := slices.Clone(kafkaOpts)
	opts = append(opts, topicOpts...)
	opts = append(opts,
		kgo.ConsumerGroup(cfg.Group),
		// Offsets are committed by hand, only after the batch's transaction
		// committed; see doc.go.
		kgo.DisableAutoCommit(),
		// No rebalance between a poll and the commit of what it returned; see
		// doc.go for the race this closes.
		kgo.BlockRebalanceOnPoll(),
		// A new group starts at the beginning of each partition: events
		// produced before the first `bridge consume` must not be skipped.
		// (After data loss the default RewindOffset re-reads a minute, which
		// the inbox makes harmless.)
		kgo.ConsumeStartOffset(kgo.NewOffset().AtStart()),
		// Records of an aborted Kafka transaction never happened; they must
		// not become webhooks.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// A rebalance waiting on our batch is worth a log line: a batch that
		// outlives the rebalance timeout gets this member removed.
		kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) {
			c.logger.Debug("a rebalance is waiting for the batch in flight")
		}),
		// franz-go's 45s default keeps a SIGKILLed member's partitions
		// idle for 45s, and twice that when it was the group leader (the
		// survivors wait in SyncGroup for the dead leader, then rejoin).
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.HeartbeatInterval(cfg.heartbeatInterval()),
		kgo.RebalanceTimeout(cfg.RebalanceTimeout),
	)
	if cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(cfg.InstanceID))
	}
	if cfg.GroupProtocol == "consumer" {
		// KIP-848 (franz-go's opt-in since v1.22): the broker assigns
		// partitions with its "uniform" assignor (our first balancer is
		// cooperative-sticky). franz-go falls back to classic by itself
		// when the broker lacks the v1 ConsumerGroupHeartbeat API.
		opts = append(opts, kgo.ServerSideBalancer())
	}
	opts = append(opts, cfg.groupOpts...)
	c.client, err = kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("create kafka consumer: %w", err)
	}
	dlqOpts := append(slices.Clone(kafkaOpts),
		// "<topic>.dlq" is created on first use where the broker allows
		// auto-creation (auto.create.topics.enable); elsewhere the operator
		// creates it, and the partition waits (logging) until then. Kept to
		// this producer so a typo in CONSUMER_TOPICS does not create a topic.
		kgo.AllowAutoTopicCreation(),
		kgo.RecordDeliveryTimeout(cfg.DeadLetterTimeout),
	)
	c.dlq, err = kgo.NewClient(dlqOpts...)
	if err != nil {
		c.client.Close()
		return nil, fmt.Errorf("create kafka dead-letter producer: %w", err)
	}
	return c, nil
}

func cmpLogger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return logging.Discard()
	}
	return l
}

// ValidateTopics checks CONSUMER_TOPICS (non-empty, valid regular
// expressions) without connecting anywhere, so a command can refuse a bad
// value before it opens the database.
func ValidateTopics(topics []string) error {
	_, err := topicOptions(topics)
	return err
}

// topicOptions turns CONSUMER_TOPICS into consume options: plain names, or,
// when any entry starts with "~", regular expressions (plain entries then
// anchored exactly) that never match a dead-letter topic.
func topicOptions(topics []string) ([]kgo.Opt, error) {
	var regex bool
	clean := make([]string, 0, len(topics))
	for _, t := range topics {
		t = strings.TrimSpace(t)
		if t == "" {
			continue
		}
		isRegex := strings.HasPrefix(t, "~")
		// A name Kafka refuses would be fetched forever, logging
		// INVALID_TOPIC_EXCEPTION: refuse it at start-up instead, by the
		// rule the outbox's topics follow.
		if p := topicname.Problem(t); !isRegex && p != "" {
			return nil, &config.Error{Var: "CONSUMER_TOPICS", Value: t, Problem: "is not a valid Kafka topic name: " + p}
		}
		regex = regex || isRegex
		clean = append(clean, t)
	}
	if len(clean) == 0 {
		return nil, &config.Error{Var: "CONSUMER_TOPICS", Problem: "is required (comma-separated topic list)"}
	}
	if !regex {
		return []kgo.Opt{kgo.ConsumeTopics(clean...)}, nil
	}
	exprs := make([]string, len(clean))
	for i, t := range clean {
		if expr, ok := strings.CutPrefix(t, "~"); ok {
			if _, err := regexp.Compile(expr); err != nil {
				return nil, &config.Error{Var: "CONSUMER_TOPICS", Value: t, Problem: "is not a valid regular expression: " + err.Error()}
			}
			exprs[i] = expr
		} else {
			exprs[i] = "^" + regexp.QuoteMeta(t) + "$"
		}
	}
	return []kgo.Opt{
		kgo.ConsumeTopics(exprs...),
		kgo.ConsumeRegex(),
		// Consuming our own dead letters would dead-letter them again.
		kgo.ConsumeExcludeTopics(regexp.QuoteMeta(contract.DeadLetterSuffix) + "$"),
	}, nil
}

// Run consumes until ctx is cancelled, then stops polling, finishes and
// commits the batch in flight (within Config.ShutdownTimeout), leaves the
// group and returns nil. It returns an error only if it cannot run at all.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("consumer: Run called twice")
	}
	defer c.Close()
	c.logger.InfoContext(ctx, "consumer started", "topics", c.cfg.Topics, "max_poll_records", c.cfg.MaxPollRecords,
		"group_protocol", c.cfg.GroupProtocol, "session_timeout", c.cfg.SessionTimeout, "instance_id", c.cfg.InstanceID)

	var wg sync.WaitGroup
	defer wg.Wait()
	pruneCtx, stopPrune := context.WithCancel(ctx)
	defer stopPrune()
	wg.Go(func() { c.pruneLoop(pruneCtx) })

	// work outlives ctx by at most ShutdownTimeout, so the batch in flight
	// at shutdown is finished and committed rather than cut off.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	var deadline atomic.Pointer[time.Timer]
	stopDeadline := context.AfterFunc(ctx, func() { deadline.Store(time.AfterFunc(c.cfg.ShutdownTimeout, cancelWork)) })
	defer func() {
		stopDeadline()
		if t := deadline.Load(); t != nil {
			t.Stop()
		}
	}()

	for {
		fetches := c.client.PollRecords(ctx, c.cfg.MaxPollRecords)
		if fetches.IsClientClosed() {
			return nil
		}
		if ctx.Err() != nil {
			// Whatever this poll returned is not processed and not
			// committed: the group hands it out again.
			c.client.AllowRebalance()
			c.logger.InfoContext(work, "consumer stopped", "stats", c.Stats())
			return nil
		}
		var fetchErrs int
		fetches.EachError(func(topic string, partition int32, err error) {
			fetchErrs++
			c.logger.WarnContext(ctx, "fetch failed", "topic", topic, "partition", partition, "err", err)
		})
		recs := fetches.Records()
		if len(recs) == 0 {
			c.client.AllowRebalance()
			if fetchErrs > 0 {
				service.Sleep(ctx, time.Second) // do not spin on a persistent fetch error
			}
			continue
		}
		c.held.Store(int64(len(recs)))
		err := c.handle(work, recs)
		c.held.Store(0)
		c.client.AllowRebalance()
		if errors.Is(err, errCrash) {
			return err
		}
		if err != nil {
			// Only the shutdown deadline stops a batch: its records stay
			// uncommitted and are redelivered (and deduplicated) later.
			c.logger.WarnContext(work, "batch abandoned at shutdown; it will be redelivered", "records", len(recs), "err", err)
			return nil
		}
	}
}

// Held is how many polled records the consumer holds and has not finished:
// work waiting for it. With Stats().Records (which grows as records are
// finished) it tells a consumer stuck on a batch from an idle one
// (internal/progress).
func (c *Consumer) Held() int64 { return c.held.Load() }

// errCrash wraps the error of a test's beforeCommit hook.
var errCrash = errors.New("simulated crash before offset commit")

// handle processes one polled batch and commits its offsets.
func (c *Consumer) handle(ctx context.Context, recs []*kgo.Record) error {
	start := time.Now()
	if err := c.process(ctx, recs); err != nil {
		return err
	}
	if c.beforeCommit != nil {
		if err := c.beforeCommit(recs); err != nil {
			return fmt.Errorf("%w: %w", errCrash, err)
		}
	}
	// Commit exactly the records processed (never CommitUncommittedOffsets:
	// a poll abandoned at shutdown must not be committed by a later call).
	if err := c.client.CommitRecords(ctx, recs...); err != nil {
		// The transaction committed, so the records are done; if this member
		// lost the partitions meanwhile, their new owner finds them in the
		// inbox. Nothing to retry.
		c.stats.commitFailures.Add(1)
		c.logger.WarnContext(ctx, "offset commit failed; the batch will be redelivered and deduplicated", "records", len(recs), "err", err)
	}
	c.logger.DebugContext(ctx, "batch done", "records", len(recs), "duration", time.Since(start))
	return nil
}

// process turns a batch into deliveries (one transaction) and dead letters,
// retrying until both are durable or ctx ends.
func (c *Consumer) process(ctx context.Context, recs []*kgo.Record) error {
	evs := make([]*event, len(recs))
	spans := make([]trace.Span, len(recs))
	ctxs := make([]context.Context, len(recs))
	parseRecord := func(ctx context.Context, r *kgo.Record) (*event, error) { return parse(ctx, r, c.cfg.Values) }
	if c.parse != nil {
		parseRecord = func(_ context.Context, r *kgo.Record) (*event, error) { return c.parse(r), nil }
	}
	for i, r := range recs {
		// A schema registry that cannot answer holds the batch (as an
		// unreachable PostgreSQL does) rather than dead-lettering records
		// that are fine: /readyz reports the stall.
		err := c.retry(ctx, "decode with the schema registry", func(ctx context.Context) (err error) {
			evs[i], err = parseRecord(ctx, r)
			return err
		})
		if err != nil {
			for _, s := range spans[:i] {
				s.End()
			}
			return err
		}
		ctxs[i], spans[i] = c.startSpan(ctx, evs[i])
	}
	var good []*event
	first := make(map[string]bool, len(evs))
	for _, ev := range evs {
		switch {
		case ev.badReason != "":
		case first[ev.dedupID]:
			// The same event twice in one batch (a duplicate produce): the
			// first copy makes the deliveries.
			ev.duplicate = true
		default:
			first[ev.dedupID] = true
			good = append(good, ev)
		}
	}
	var err error
	if len(good) > 0 {
		err = c.retry(ctx, "store batch", func(ctx context.Context) error { return c.store(ctx, good) })
	}
	if err == nil {
		err = c.retry(ctx, "produce dead letters", func(ctx context.Context) error { return c.deadLetter(ctx, evs, ctxs) })
	}
	for i, ev := range evs {
		c.finish(ctxs[i], spans[i], ev, err)
	}
	if err != nil {
		return err
	}
	c.stats.batches.Add(1)
	return nil
}

// startSpan starts the record's CONSUMER span under the trace in its
// traceparent header and decides which trace context its deliveries carry.
func (c *Consumer) startSpan(ctx context.Context, ev *event) (context.Context, trace.Span) {
	r := ev.rec
	parent := tracing.ContextWithRemoteParent(ctx, ev.traceparent, ev.tracestate)
	sctx, span := c.tracer.Start(parent, "process "+r.Topic, trace.WithSpanKind(trace.SpanKindConsumer))
	if !span.IsRecording() {
		// No SDK or not sampled: the attributes would be built for nothing,
		// for every record. The header's own context is passed on, so the
		// trace still continues.
		ev.traceparent, ev.tracestate = tracing.Traceparent(parent)
		return sctx, span
	}
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "kafka"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.destination.name", r.Topic),
		attribute.String("messaging.message.id", ev.dedupID),
		attribute.Int("messaging.kafka.destination.partition", int(r.Partition)),
		attribute.Int64("messaging.kafka.message.offset", r.Offset),
		attribute.String("messaging.consumer.group.name", c.cfg.Group),
	}
	if len(r.Key) > 0 {
		attrs = append(attrs, attribute.String("messaging.kafka.message.key", strings.ToValidUTF8(string(r.Key), "\uFFFD")))
	}
	span.SetAttributes(attrs...)
	// A recording span is the webhook's parent.
	if span.SpanContext().IsValid() {
		ev.traceparent, ev.tracestate = tracing.Traceparent(sctx)
	} else {
		ev.traceparent, ev.tracestate = tracing.Traceparent(parent)
	}
	return sctx, span
}

// finish records the record's outcome on its span, logs it and counts it.
func (c *Consumer) finish(ctx context.Context, span trace.Span, ev *event, err error) {
	defer span.End()
	// The record's logger is built only for a line that is written: at
	// 1,000 records/s the four attributes of every record cost ~1% of the
	// bridge's CPU with debug lines off.
	log := func() *slog.Logger {
		return c.logger.With("dedup_id", ev.dedupID, "topic", ev.rec.Topic, "partition", ev.rec.Partition, "offset", ev.rec.Offset)
	}
	debug := c.logger.Enabled(ctx, slog.LevelDebug)
	switch {
	case err != nil:
		span.SetStatus(codes.Error, "batch not stored: "+err.Error())
		return
	case ev.badReason != "":
		span.SetAttributes(attribute.String("bridge.dlq_reason", ev.badReason))
		span.SetStatus(codes.Error, "dead-lettered: "+ev.badReason)
		c.stats.deadLettered.Add(1)
		log().WarnContext(ctx, "record dead-lettered", "reason", ev.badReason, "dlq_topic", ev.rec.Topic+contract.DeadLetterSuffix)
	case ev.duplicate:
		span.SetAttributes(attribute.Bool("bridge.duplicate", true))
		c.stats.duplicates.Add(1)
		if debug {
			log().DebugContext(ctx, "record already processed; no deliveries")
		}
	default:
		span.SetAttributes(attribute.Int("bridge.deliveries", ev.deliveries))
		c.stats.deliveries.Add(int64(ev.deliveries))
		if debug {
			log().DebugContext(ctx, "record processed", "deliveries", ev.deliveries)
		}
	}
	c.stats.records.Add(1)
}

// deadLetter produces every bad record of the batch that was not yet
// acknowledged to "<topic>.dlq", and waits for the acknowledgements.
func (c *Consumer) deadLetter(ctx context.Context, evs []*event, ctxs []context.Context) error {
	var recs []*kgo.Record
	var which []*event
	for _, ev := range evs {
		if ev.badReason == "" || ev.deadDone {
			continue
		}
		r := ev.rec
		hs := make([]kgo.RecordHeader, 0, len(r.Headers)+4)
		hs = append(hs, r.Headers...)
		hs = append(hs,
			kgo.RecordHeader{Key: contract.HeaderDLQReason, Value: []byte(ev.badReason)},
			kgo.RecordHeader{Key: contract.HeaderDLQTopic, Value: []byte(r.Topic)},
			kgo.RecordHeader{Key: contract.HeaderDLQPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
			kgo.RecordHeader{Key: contract.HeaderDLQOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
		)
		recs = append(recs, &kgo.Record{Topic: r.Topic + contract.DeadLetterSuffix, Key: r.Key, Value: r.Value, Headers: hs, Timestamp: r.Timestamp})
		which = append(which, ev)
	}
	if len(recs) == 0 {
		return nil
	}
	var errs []error
	for i, res := range c.dlq.ProduceSync(ctx, recs...) {
		if res.Err != nil {
			errs = append(errs, fmt.Errorf("produce to %s: %w", recs[i].Topic, res.Err))
			continue
		}
		which[i].deadDone = true
	}
	return errors.Join(errs...)
}

// retry runs fn until it succeeds or ctx ends, backing off between attempts.
// Every failure here is one the batch must wait out (PostgreSQL or the broker
// unreachable): skipping would lose records.
func (c *Consumer) retry(ctx context.Context, what string, fn func(context.Context) error) error {
	return service.Retry(ctx, service.Wait{
		Name:    what,
		Backoff: service.Backoff{Base: c.cfg.RetryBackoff, Max: c.cfg.RetryBackoffMax},
		// An outage of minutes is a few lines per kind of failure.
		LogEvery: 10 * time.Second,
		Logger:   c.logger,
	}, fn)
}

// Close leaves the group and closes the Kafka clients. Run calls it on
// return; call it yourself only for a Consumer that never ran. Safe to call
// twice.
func (c *Consumer) Close() {
	c.closeOnce.Do(func() {
		// Nothing polled is uncommitted-but-processed here (handle commits
		// before returning), so allowing the final revoke is safe; the
		// default revoke commits nothing with autocommit disabled.
		c.client.CloseAllowingRebalance()
		c.dlq.Close()
	})
}
