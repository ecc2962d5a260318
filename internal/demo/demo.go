package demo

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxbridge/bridge/internal/consumer"
	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/outboxstore"
	"github.com/outboxbridge/bridge/internal/webhooktest"
)

// Defaults of the command's flags: about ten seconds of workload, which a
// 2-core machine delivers with room to spare.
const (
	// DefaultDatabaseURL is where scripts/services-up.sh (and so `make
	// demo`) starts PostgreSQL; the demo uses it when DATABASE_URL is unset.
	DefaultDatabaseURL = "postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable"
	DefaultEvents      = 2000
	DefaultAssets      = 50
	DefaultRate        = 200
	DefaultTimeout     = 30 * time.Second
	// DefaultMaxMessageBytes is the RELAY_MAX_MESSAGE_BYTES the demo runs
	// with unless the environment sets one; the poison event is larger.
	DefaultMaxMessageBytes = 64 << 10
)

// Env is what a run needs from its caller: the shared runtime of `bridge
// run` (pool, tracer provider) and the pipeline itself.
type Env struct {
	// Pool is the pipeline's database pool; the workload enqueues through it.
	Pool *pgxpool.Pool
	// FastLane: the pipeline delivers from the topic's partitions
	// (WEBHOOK_FAST_LANE), PostgreSQL only for streams that are retrying.
	FastLane bool
	// Subscriptions creates (and at the end removes) the run's subscription.
	Subscriptions *store.SubscriptionStore
	// Pipeline runs relay + consume + deliver until its context ends and
	// returns nil after a clean shutdown: the wiring of `bridge run`.
	Pipeline func(ctx context.Context) error
	// TracerProvider records the workload's spans (nil: none). Exporting
	// says spans go somewhere (an OTLP endpoint), so a trace id is worth
	// printing.
	TracerProvider trace.TracerProvider
	Exporting      bool
	// TraceText, when set, returns the sample trace's waterfall as text
	// (flushing the spans and reading them back from Jaeger's query API);
	// the summary prints it under the trace id.
	TraceText func(ctx context.Context, traceID string) (string, error)
	// Topic is the run's topic (Topic(runID)), already created on Brokers.
	Topic          string
	RunID          string
	Brokers        []string
	EmbeddedBroker bool
	// MaxMessageBytes is the relay's RELAY_MAX_MESSAGE_BYTES: the poison
	// event's payload is made larger than this.
	MaxMessageBytes int
	// Logger for the demo's own messages (nil: discard).
	Logger *slog.Logger
	// Database (password redacted) and LogFile are shown in the header.
	Database     string
	DatabaseNote string // why the demo runs in a scratch database, if it does
	LogFile      string
}

// Options are the command's flags.
type Options struct {
	// Events to enqueue (at least MinEvents). Default DefaultEvents.
	Events int
	// Assets the events are spread over (at most Events/4). Default DefaultAssets.
	Assets int
	// Rate in events per second; negative: as fast as the writers go.
	// 0: DefaultRate.
	Rate float64
	// Duration caps the time spent enqueueing (0: no cap).
	Duration time.Duration
	// Timeout bounds the wait for the last deliveries once the workload is
	// over. Default DefaultTimeout.
	Timeout time.Duration
	// Writers: concurrent enqueueing connections. Default 4.
	Writers int
	// Keep leaves the run's subscription (disabled) with its delivery log,
	// and its outbox rows (the parked poison among them), for `bridge
	// deliveries list` and `bridge outbox failed`; by default the run
	// removes them.
	Keep bool
	// Progress and Out: how and where progress is shown.
	Progress ProgressMode
	Out      io.Writer
	// Tick is how often the pipeline is read for progress. Default 250ms.
	Tick time.Duration
	// OnProgress, if set, sees every reading (tests use it to cancel mid-run).
	OnProgress func(Progress)
	// Seed makes the workload's plan reproducible (0: random).
	Seed uint64
	// Refusals: the receiver answers 500 to the first attempt of the third
	// event of this many assets, so the run shows a stream handed to the
	// slow lane and back (with the fast lane) or retried (without).
	// Default DefaultRefusals; negative: none.
	Refusals int
}

// DefaultRefusals is how many assets' streams the receiver refuses once.
const DefaultRefusals = 3

// refusedNth is which event of a stream the receiver refuses once: the
// third, so events before and after it show the hand-over.
const refusedNth = 3

func (o Options) withDefaults() Options {
	o.Events = cmp.Or(o.Events, DefaultEvents)
	o.Assets = cmp.Or(o.Assets, DefaultAssets)
	o.Rate = cmp.Or(o.Rate, DefaultRate)
	o.Timeout = cmp.Or(o.Timeout, DefaultTimeout)
	o.Writers = cmp.Or(o.Writers, 4)
	o.Tick = cmp.Or(o.Tick, 250*time.Millisecond)
	o.Refusals = max(cmp.Or(o.Refusals, DefaultRefusals), 0)
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		for _, x := range b {
			o.Seed = o.Seed<<8 | uint64(x)
		}
	}
	return o
}

// Validate checks the flags (the command exits 2 on an error).
func (o Options) Validate() error {
	o = o.withDefaults()
	switch {
	case o.Events < MinEvents:
		return fmt.Errorf("--events must be at least %d (one of each lifecycle step), got %d", MinEvents, o.Events)
	case o.Assets < 1:
		return fmt.Errorf("--assets must be at least 1, got %d", o.Assets)
	case o.Assets > o.Events/4:
		return fmt.Errorf("--assets must be at most --events/4 (%d) so each asset has a lifecycle, got %d", o.Events/4, o.Assets)
	case o.Duration < 0:
		return fmt.Errorf("--duration must not be negative, got %s", o.Duration)
	case o.Timeout < 0:
		return fmt.Errorf("--timeout must not be negative, got %s", o.Timeout)
	case o.Writers < 1:
		return errors.New("writers must be at least 1")
	}
	return nil
}

// NewRunID returns a short random id naming a run's topic, consumer group and
// subscription.
func NewRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Run plays the workload through the pipeline and returns what the receiver
// and the database saw. It returns a summary whenever the run got as far as
// starting the pipeline — also when ctx is cancelled (Interrupted, no error)
// and when the pipeline or the workload failed (with that error). Whether the
// run proved what it should is Summary.Err.
func Run(ctx context.Context, env Env, o Options) (*Summary, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tp := env.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	started := time.Now()
	// Cleanup must run even after Ctrl-C: it gets its own deadline.
	cleanupCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	}

	// 1. The receiver, on loopback. Its URL needs WEBHOOK_ALLOWED_CIDRS to
	// cover 127.0.0.0/8 and WEBHOOK_ALLOW_HTTP: the command sets both.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo receiver: %w", err)
	}
	url := "http://" + ln.Addr().String() + receiverPath
	topic := env.Topic
	sub, err := env.Subscriptions.Create(ctx, store.SubscriptionInput{
		URL:         &url,
		EventTypes:  []string{"*"},
		Topic:       &topic,
		Description: ptr("bridge demo run " + env.RunID),
	})
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("create the demo subscription: %w", err)
	}
	defer func() {
		cctx, cancel := cleanupCtx()
		defer cancel()
		if o.Keep {
			if _, err := env.Subscriptions.Disable(cctx, sub.ID, "bridge demo run "+env.RunID+" finished"); err != nil {
				log.Warn("demo subscription left enabled", "subscription", sub.ID, "error", err)
			}
			return
		}
		// The pipeline has stopped (deferred later, run earlier): nothing
		// writes these rows any more.
		if err := env.Subscriptions.Delete(cctx, sub.ID); err != nil {
			log.Warn("demo subscription left behind", "subscription", sub.ID, "error", err)
		}
		if err := outboxstore.DeleteTopic(cctx, env.Pool, topic); err != nil {
			log.Warn("demo rows left behind", "topic", topic, "error", err)
		}
		if err := consumer.ForgetTopic(cctx, env.Pool, topic); err != nil {
			log.Warn("demo rows left behind", "topic", topic, "error", err)
		}
	}()
	rcv, err := webhooktest.NewWithSecret(sub.Secret)
	if err != nil {
		ln.Close()
		return nil, err
	}
	rcv.Respond = refuseOnce(o.Refusals)
	// A server span per request, continuing the webhook's traceparent, so
	// the trace ends in the subscriber's handler.
	handler := otelhttp.NewHandler(rcv, "demo receiver",
		otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithSpanNameFormatter(func(string, *http.Request) string { return "demo receiver: verify and check order" }))
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		cctx, cancel := cleanupCtx()
		defer cancel()
		_ = srv.Shutdown(cctx)
	}()

	if o.Progress != ProgressNone {
		printHeader(o.Out, env, o, url)
	}

	// 2. The pipeline: relay + consume + deliver, as `bridge run` runs them.
	pipeCtx, stopPipe := context.WithCancel(ctx)
	defer stopPipe()
	pipeDone := make(chan error, 1)
	go func() { pipeDone <- env.Pipeline(pipeCtx) }()
	var pipeErr error
	pipeRunning := true
	stopPipeline := func() {
		if !pipeRunning {
			return
		}
		stopPipe()
		pipeErr = <-pipeDone
		pipeRunning = false
	}
	defer stopPipeline()

	// 3. The workload, at its rate, in the background.
	pl := &player{
		pool: env.Pool, tracer: tp.Tracer("github.com/outboxbridge/bridge/internal/demo"),
		rate: o.Rate, duration: o.Duration, writers: o.Writers,
		commits: make(map[string]committed),
	}
	poisonBytes := env.MaxMessageBytes + 16<<10
	txs := plan(topic, env.RunID, o.Events, o.Assets, poisonBytes, o.Seed)
	playCtx, stopPlay := context.WithCancel(ctx)
	defer stopPlay()
	playDone := make(chan error, 1)
	go func() { playDone <- pl.play(playCtx, txs) }()

	// 4. Watch until every event arrived (or died), the pipeline fails, the
	// timeout passes or ctx ends.
	disp := newDisplay(o.Progress, o.Out, o.Events-1)
	sum := &Summary{
		RunID: env.RunID, Topic: topic, Brokers: strings.Join(env.Brokers, ","),
		EmbeddedBroker: env.EmbeddedBroker, SubscriptionID: sub.ID, Kept: o.Keep, Exporting: env.Exporting, Database: env.Database,
	}
	var (
		runErr     error
		playing    = true
		playedAt   time.Time
		last       Progress
		rateWindow []Progress
	)
	tick := time.NewTicker(o.Tick)
	defer tick.Stop()
	read := func(rctx context.Context) Progress {
		// The database first, then the receiver, then the workload: each
		// count is then read no earlier than the one downstream of it.
		p := Progress{}
		qctx, cancel := context.WithTimeout(rctx, database.QueryTimeout)
		defer cancel()
		var dead int64
		if sent, failed, err := outboxstore.TopicCounts(qctx, env.Pool, topic); err == nil {
			p.Relayed, p.Failed = int(sent), int(failed)
		} else {
			p.Relayed, p.Failed = last.Relayed, last.Failed
		}
		var err error
		if _, dead, err = store.SubscriptionOutcomes(qctx, env.Pool, sub.ID); err == nil {
			p.Dead = int(dead)
		} else {
			p.Dead = last.Dead
		}
		p.Delivered = rcv.Stats().Accepted
		p.Enqueued = int(pl.enqueued.Load())
		p.Elapsed = time.Since(started)
		p.Lag = max(0, p.Enqueued-p.Delivered-p.Failed-p.Dead)
		// Deliveries per second over the readings of the last two seconds.
		rateWindow = append(rateWindow, p)
		for len(rateWindow) > 1 && p.Elapsed-rateWindow[0].Elapsed > 2*time.Second {
			rateWindow = rateWindow[1:]
		}
		if first := rateWindow[0]; p.Elapsed > first.Elapsed {
			p.Rate = float64(p.Delivered-first.Delivered) / (p.Elapsed - first.Elapsed).Seconds()
		}
		return p
	}
loop:
	for {
		select {
		case <-ctx.Done():
			sum.Interrupted = true
			break loop
		case err := <-pipeDone:
			pipeRunning = false
			pipeErr = err
			if err == nil {
				err = errors.New("the pipeline stopped by itself")
			}
			runErr = fmt.Errorf("pipeline: %w", err)
			break loop
		case err := <-playDone:
			playing = false
			playedAt = time.Now()
			if err != nil {
				runErr = fmt.Errorf("workload: %w", err)
				break loop
			}
			if ctx.Err() != nil {
				sum.Interrupted = true
				break loop
			}
			disp.expect(int(pl.enqueued.Load() - pl.poisoned.Load()))
			log.Info("workload enqueued", "events", pl.enqueued.Load(), "transactions", pl.transactions.Load())
		case <-tick.C:
			last = read(ctx)
			disp.update(last)
			if o.OnProgress != nil {
				o.OnProgress(last)
			}
			if playing {
				continue
			}
			poison := int(pl.poisoned.Load())
			if last.Delivered+last.Dead >= last.Enqueued-poison && last.Failed >= poison {
				break loop
			}
			if time.Since(playedAt) > o.Timeout {
				sum.TimedOut = true
				break loop
			}
		}
	}
	if sum.Interrupted {
		// Let the workload notice the cancellation before it is counted, so
		// the summary's enqueued count is what committed.
		if playing {
			<-playDone
		}
	}

	// 5. Stop the pipeline (drains in flight), then count.
	stopPipeline()
	if runErr == nil && pipeErr != nil {
		runErr = fmt.Errorf("pipeline: %w", pipeErr)
	}
	if playing && !sum.Interrupted {
		stopPlay() // the pipeline failed mid-workload
		<-playDone
	}
	cctx, cancel := cleanupCtx()
	defer cancel()
	final := read(cctx)
	disp.finish(final)
	sum.Elapsed = time.Since(started)
	fill(cctx, sum, final, pl, rcv, env)
	if env.TraceText != nil && env.Exporting && sum.TraceID != "" {
		if text, err := env.TraceText(cctx, sum.TraceID); err != nil {
			sum.WaterfallError = err.Error()
		} else {
			sum.Waterfall = text
		}
	}
	return sum, runErr
}

// receiverPath is where the demo's receiver listens; it names the one
// subscription in the receiver's bookkeeping.
const receiverPath = "/webhooks"

// refuseOnce answers 500 to the first attempt of the refusedNth event that
// reaches it of each of the first n assets, and 204 to everything else.
// Events are counted as they arrive, not by asset_seq: a database that ran
// demos before continues its assets' sequences.
func refuseOnce(n int) func(*webhooktest.Request) (int, time.Duration) {
	var mu sync.Mutex
	seen := map[string]int{}
	refused := 0
	return func(rq *webhooktest.Request) (int, time.Duration) {
		e := rq.Envelope
		if rq.Attempt != 1 || e.AssetSeq == nil {
			return http.StatusNoContent, 0
		}
		mu.Lock()
		defer mu.Unlock()
		k := e.AssetKey()
		seen[k]++
		if seen[k] != refusedNth || refused >= n {
			return http.StatusNoContent, 0
		}
		refused++
		return http.StatusInternalServerError, 0
	}
}

// fill completes the summary from the last reading, the receiver and the
// workload's commit times.
func fill(ctx context.Context, sum *Summary, p Progress, pl *player, rcv *webhooktest.Receiver, env Env) {
	st := rcv.Stats()
	sum.Enqueued = int(pl.enqueued.Load())
	sum.Transactions = int(pl.transactions.Load())
	sum.Poison = int(pl.poisoned.Load())
	sum.Relayed = p.Relayed
	sum.Failed = p.Failed
	sum.Dead = p.Dead
	sum.Delivered = st.Accepted
	sum.Refused = st.Refused
	sum.FastLane = env.FastLane
	if env.FastLane {
		// The fast lane writes no delivery rows: every row of the run's
		// subscription is one the slow lane delivered.
		if slow, _, err := store.SubscriptionOutcomes(ctx, env.Pool, sum.SubscriptionID); err == nil {
			sum.DeliveredSlowLane = int(slow)
			sum.DeliveredFastLane = max(0, sum.Delivered-sum.DeliveredSlowLane)
		}
	}
	sum.Duplicates = st.Duplicates
	sum.OrderViolations = st.OrderViolations
	sum.Overlaps = st.Overlaps
	sum.SignatureFailures = st.SignatureFailures
	sum.Malformed = st.Malformed
	sum.Problems = st.Examples
	sum.Missing = max(0, sum.Enqueued-sum.Poison-sum.Delivered-sum.Dead)

	var lat []time.Duration
	for id, c := range pl.snapshot() {
		a, ok := rcv.Arrival(receiverPath, id)
		if !ok {
			continue
		}
		lat = append(lat, max(0, a.At.Sub(c.at)))
		if a.TraceID != "" && a.TraceID == c.traceID {
			sum.TracesContinued++
		}
	}
	sum.LatencyP50, sum.LatencyP95, sum.LatencyP99, sum.LatencyMax = percentiles(lat)
	pl.mu.Lock()
	sum.TraceID = pl.sample
	pl.mu.Unlock()

	if sum.Failed > 0 {
		if rows, err := outboxstore.ListFailed(ctx, env.Pool, sum.Topic, 1, false, 0); err == nil && len(rows) > 0 {
			sum.FailedReason = rows[0].LastError
		}
	}
}

func printHeader(w io.Writer, env Env, o Options, url string) {
	var b strings.Builder
	fmt.Fprintf(&b, "Outbox Bridge demo · run %s\n", env.RunID)
	if env.Database != "" {
		fmt.Fprintf(&b, "  PostgreSQL  %s\n", env.Database)
	}
	if env.DatabaseNote != "" {
		fmt.Fprintf(&b, "              (%s)\n", env.DatabaseNote)
	}
	brokers := strings.Join(env.Brokers, ",")
	if env.EmbeddedBroker {
		fmt.Fprintf(&b, "  Kafka       embedded broker at %s; read it with\n", brokers)
		fmt.Fprintf(&b, "                kcat -b %s -t %s -C -f '%%k %%h %%s\\n'\n", brokers, env.Topic)
	} else {
		fmt.Fprintf(&b, "  Kafka       %s, topic %s\n", brokers, env.Topic)
	}
	fmt.Fprintf(&b, "  receiver    %s (verifies every signature, checks per-asset order)\n", url)
	rate := "as fast as it goes"
	if o.Rate > 0 {
		rate = fmt.Sprintf("at %.0f events/s", o.Rate)
	}
	fmt.Fprintf(&b, "  workload    %d events over %d assets %s", o.Events, o.Assets, rate)
	if o.Duration > 0 {
		fmt.Fprintf(&b, " for at most %s", o.Duration)
	}
	b.WriteString(", one poison event\n")
	if env.LogFile != "" {
		fmt.Fprintf(&b, "  logs        %s\n", env.LogFile)
	}
	b.WriteString("\n")
	_, _ = io.WriteString(w, b.String())
}

func ptr[T any](v T) *T { return &v }
