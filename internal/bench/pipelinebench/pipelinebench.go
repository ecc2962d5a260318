// Package pipelinebench measures the whole bridge end to end at a fixed
// offered rate (`bridge bench pipeline`): writers commit events to the outbox
// in small transactions, a `bridge run` process (relay + consume + deliver)
// carries them through the configured broker, and an in-process receiver
// (internal/webhooktest: signatures verified, order, duplicates and
// overlapping requests per (subscription, asset)) records when each webhook
// arrives. It reports commit→webhook-received latency, each stage's rate
// over the load, the lag each stage had when the load ended, the time to
// drain it, and the bridge process's peak memory and CPU.
//
// The bridge runs as a process of its own so that its memory is measured
// alone: the bench's bookkeeping (one commit time per event, the receiver's
// per-event dedup map) grows with the run and would hide the bridge's.
package pipelinebench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/bench/relaybench"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/webhooktest"
	"github.com/outboxbridge/bridge/outbox"
)

// Options configure one run; zero fields take the defaults named.
type Options struct {
	Rate          int           // offered events/s; default 1000
	Subscriptions int           // each receives every event; default 3
	Duration      time.Duration // how long the load is offered; default 5m
	Writers       int           // concurrent writers; default 8
	TxEvents      int           // events per transaction; default 10
	Assets        int           // assets the events are keyed over; default 1000
	Partitions    int32         // of the bench topic; default 6
	// WarmUp offers the same rate for this long before the measured load,
	// as events of type bench.warmup that no figure counts: a pipeline that
	// was idle opens its connections and grows its pools and heap during
	// the first seconds of load, and the measured minutes should show the
	// steady state (a run with no warm-up shows the start). Zero: none.
	WarmUp time.Duration
	// DrainTimeout bounds the wait, after the load, for every webhook to
	// arrive. Default 2m.
	DrainTimeout time.Duration
	// DatabaseURL is the run's database as the bridge process gets it (the
	// same database as the pool Run is given).
	DatabaseURL string
	// Bridge returns the command that runs `bridge run` with env added to
	// its environment (later entries win). Run starts it once the topic and
	// the subscriptions exist and stops it with SIGTERM at the end.
	Bridge func(env []string) *exec.Cmd
	// Progress is told what the run is doing (nil: nothing).
	Progress func(string)
	// FastLane runs the bridge with WEBHOOK_FAST_LANE=true: `bridge run`
	// then delivers straight from the topic (no consume stage, rows only
	// for streams handed to the slow lane).
	FastLane bool
	// ExactReceiver keeps the per-event bookkeeping for the whole run: the
	// receiver's map entry per (subscription, webhook-id) and every event's
	// commit time. Without it the receiver is webhooktest's Bounded one
	// (as strict on these gapless streams) and an event's commit time is
	// dropped when its last webhook arrives, so this process's memory does
	// not grow with the run (a gigabyte by the tenth minute otherwise, with
	// its garbage collector on the cores being measured).
	ExactReceiver bool
}

// Result is what `bridge bench pipeline` prints. Field names are stable:
// new ones are added, none renamed.
type Result struct {
	OfferedRate   int     `json:"offered_events_per_second"`
	AchievedRate  float64 `json:"achieved_events_per_second"`
	Subscriptions int     `json:"subscriptions"`
	Writers       int     `json:"writers"`
	TxEvents      int     `json:"events_per_transaction"`
	Assets        int     `json:"assets"`
	Partitions    int32   `json:"partitions"`
	Events        int     `json:"events"`
	Webhooks      int64   `json:"webhooks_expected"`
	LoadSeconds   float64 `json:"load_seconds"`
	// WarmUpSeconds: how long the rate was offered, unmeasured, before
	// the load (Options.WarmUp).
	WarmUpSeconds float64 `json:"warm_up_seconds"`
	// commit→webhook received, over every (event, subscription).
	LatencyP50Ms float64 `json:"latency_p50_ms"`
	LatencyP95Ms float64 `json:"latency_p95_ms"`
	LatencyP99Ms float64 `json:"latency_p99_ms"`
	LatencyMaxMs float64 `json:"latency_max_ms"`
	// Each stage's rate over the load (what it had done when the load
	// ended, per second of load): events sent to Kafka, delivery rows the
	// consumer wrote, webhooks the receiver acknowledged.
	RelayPerSecond    float64 `json:"relay_events_per_second"`
	ConsumerPerSecond float64 `json:"consumer_deliveries_per_second"`
	WebhooksPerSecond float64 `json:"webhooks_per_second"`
	// Lag when the load ended: outbox rows not yet sent, deliveries the
	// consumer had not written yet (events × subscriptions − rows), rows
	// not yet delivered, and webhooks not yet received.
	LagOutbox     int64 `json:"lag_outbox_rows_at_end"`
	LagConsumer   int64 `json:"lag_consumer_deliveries_at_end"`
	LagDeliveries int64 `json:"lag_deliveries_at_end"`
	LagWebhooks   int64 `json:"lag_webhooks_at_end"`
	// DrainSeconds: from the end of the load until the last webhook.
	DrainSeconds float64 `json:"drain_seconds"`
	// The bridge process: peak resident memory (VmHWM) and its CPU over
	// the run, in cores (0 when /proc cannot show them).
	BridgePeakRSSMiB float64 `json:"bridge_peak_rss_mib"`
	BridgeCPUCores   float64 `json:"bridge_cpu_cores"`
	// Over the load, in cores: this process (the writers and the
	// receiver, which share the machine with what they measure) and every
	// PostgreSQL process of this machine (the bridge's and the writers'
	// backends, autovacuum, the WAL writer; 0 when none is visible, e.g. a
	// remote database). With BridgeCPUCores and MachineBusyCores they give
	// each run's CPU budget: machine − bridge − bench − PostgreSQL is the
	// broker and everything else.
	BenchCPUCores    float64 `json:"bench_cpu_cores"`
	PostgresCPUCores float64 `json:"postgres_cpu_cores"`
	// What the receiver saw (all must be 0).
	OrderViolations   int   `json:"order_violations"`
	Duplicates        int   `json:"duplicates"`
	Overlaps          int   `json:"overlapping_requests"`
	SignatureFailures int   `json:"signature_failures"`
	NotDelivered      int64 `json:"not_delivered"`
	// Minutes: latency minute by minute (by arrival time).
	Minutes []Minute `json:"minutes"`
	// Stages splits the latency by stage, from the rows' own timestamps
	// (PostgreSQL's clock): relay = outbox sent_at − created_at (created_at
	// is the writer's transaction start, so the writer's own commit is in
	// it), consumer = delivery created_at − outbox sent_at (Kafka and the
	// consumer's poll; created_at is the consumer transaction's start),
	// deliverer = delivered_at − delivery created_at (the consumer's
	// commit, the claim, the request and the outcome's write).
	Stages Stages `json:"stages"`
	// MachineBusyCores is the whole machine's CPU over the load (all
	// processes, from /proc/stat), and MachineCores how many it has: a
	// saturated machine explains a tail that the code does not.
	MachineBusyCores float64 `json:"machine_busy_cores"`
	MachineCores     int     `json:"machine_cores"`
	// Seconds is the latency second by second (by arrival time, from the
	// load's start, through the drain), with the bridge's and the machine's
	// CPU in each: a tail made of a few stalled seconds (a checkpoint, a
	// vacuum) reads differently from one spread over the whole run.
	Seconds []Second `json:"seconds"`
	// Engine is "postgres" (the consumer writes a row per delivery, the
	// deliverer claims it) or "kafka" (the fast lane: deliveries go out
	// from the topic). With the fast lane there are rows only for streams
	// handed to the slow lane: lag_consumer_deliveries_at_end and
	// lag_deliveries_at_end then count only those, and the stage split
	// (stages, minutes[].stages) covers only them.
	Engine string `json:"engine"`
	// HandedOver: deliveries of the load written to bridge.deliveries
	// (with the fast lane, those handed to the slow lane).
	HandedOver int64 `json:"handed_over_to_slow_lane"`
	// ReceiverBounded: the receiver kept per stream only what its checks
	// need (Options.ExactReceiver false).
	ReceiverBounded bool `json:"receiver_bounded"`
	// This process (writers, receiver, bookkeeping): peak resident memory,
	// and its garbage collector over the load (cycles, CPU in cores).
	BenchPeakRSSMiB  float64 `json:"bench_peak_rss_mib"`
	BenchGCCycles    int     `json:"bench_gc_cycles"`
	BenchGCCPUCores  float64 `json:"bench_gc_cpu_cores"`
	BridgeGCCycles   int     `json:"bridge_gc_cycles"`       // over the load (gctrace)
	BridgeGCPauseMax float64 `json:"bridge_gc_pause_max_ms"` // longest stop-the-world pause of a cycle
	// RelayP50Ms / RelayP99Ms: commit → the relay produced the record (the
	// record's timestamp, read back from the topic by this process); the rest
	// of commit→webhook is the broker and the delivering lane.
	RelayP50Ms float64 `json:"relay_p50_ms"`
	RelayP99Ms float64 `json:"relay_p99_ms"`
	// TracesExported: the bridge process exports its spans (an OTLP
	// endpoint in its environment, the SDK not disabled): every webhook's
	// trace then costs the bridge CPU and the collector, when it runs on
	// this machine, some more.
	TracesExported bool `json:"bridge_traces_exported"`
	// MetricsExported: the bridge pushes its metrics over OTLP (every
	// OTEL_METRIC_EXPORT_INTERVAL, 60 s by default). Each collection runs
	// the gauges' queries, the outbox's counting every row of the log.
	MetricsExported bool `json:"bridge_metrics_exported"`
	// SlowestSeconds are the ten seconds with the highest p99, worst first,
	// with what was happening in each (see Second).
	SlowestSeconds []Second `json:"slowest_seconds"`
}

// Second is one second of the run.
type Second struct {
	Second           int     `json:"second"` // from the load's start, 0-based
	Webhooks         int     `json:"webhooks"`
	LatencyP99Ms     float64 `json:"latency_p99_ms"`
	LatencyMaxMs     float64 `json:"latency_max_ms"`
	BridgeCPUCores   float64 `json:"bridge_cpu_cores"`
	MachineBusyCores float64 `json:"machine_busy_cores"`
	// What else happened in the second. Relay: commit → record produced,
	// p99 over the records produced in the second; KafkaFetch: produced →
	// fetched by this process's own reader of the topic (a broker stall
	// shows in both readers).
	RelayP99Ms      float64 `json:"relay_p99_ms"`
	KafkaFetchP99Ms float64 `json:"kafka_fetch_p99_ms"`
	// This process: GC cycles, GC CPU (ms), stop-the-world GC pauses (ms,
	// summed), p99 of its goroutines' wait to run (ms), live heap and
	// resident memory (MiB), CPU (cores).
	BenchGCCycles   int     `json:"bench_gc_cycles"`
	BenchGCCPUMs    float64 `json:"bench_gc_cpu_ms"`
	BenchGCPauseMs  float64 `json:"bench_gc_pause_ms"`
	BenchSchedP99Ms float64 `json:"bench_sched_latency_p99_ms"`
	BenchHeapMiB    float64 `json:"bench_heap_mib"`
	BenchRSSMiB     float64 `json:"bench_rss_mib"`
	BenchCPUCores   float64 `json:"bench_cpu_cores"`
	// The bridge process (gctrace): GC cycles ending in the second, their
	// stop-the-world pauses and CPU (ms, summed), its heap after the last
	// cycle and its resident memory (MiB).
	BridgeGCCycles  int     `json:"bridge_gc_cycles"`
	BridgeGCPauseMs float64 `json:"bridge_gc_pause_ms"`
	BridgeGCCPUMs   float64 `json:"bridge_gc_cpu_ms"`
	BridgeHeapMiB   float64 `json:"bridge_heap_mib"`
	BridgeRSSMiB    float64 `json:"bridge_rss_mib"`
	// The machine's processes that used most CPU in the second ("name
	// cores, …"; this bench is "bench", the bridge "bridge run").
	TopProcesses string `json:"top_processes"`
	// PostgreSQL: buffers the checkpointer and the backends wrote in the
	// second, the autovacuum workers running and the wait events of
	// active backends at its start.
	CheckpointBuffers int64  `json:"checkpoint_buffers_written"`
	BackendBuffers    int64  `json:"backend_buffers_written"`
	Autovacuum        string `json:"autovacuum,omitempty"`
	// Maintained: the run's tables autovacuum finished vacuuming or
	// analyzing in the second ("vacuumed …, analyzed …").
	Maintained    string `json:"autovacuum_done,omitempty"`
	PostgresWaits string `json:"postgres_waits,omitempty"`
	// BridgeLog: the bridge's log lines of the second (warnings and up).
	BridgeLog []string `json:"bridge_log,omitempty"`
}

// Stages are the per-stage latency percentiles (ms) over the load.
type Stages struct {
	RelayP50Ms     float64 `json:"relay_p50_ms"`
	RelayP99Ms     float64 `json:"relay_p99_ms"`
	ConsumerP50Ms  float64 `json:"consumer_p50_ms"`
	ConsumerP99Ms  float64 `json:"consumer_p99_ms"`
	DelivererP50Ms float64 `json:"deliverer_p50_ms"`
	DelivererP99Ms float64 `json:"deliverer_p99_ms"`
	// The deliverer's part split by its first attempt's log row: until the
	// request started (the consumer's commit, the claim, the workers'
	// queue), the request, and from its answer until the outcome was
	// written.
	ToRequestP50Ms float64 `json:"to_request_p50_ms"`
	ToRequestP99Ms float64 `json:"to_request_p99_ms"`
	RequestP50Ms   float64 `json:"request_p50_ms"`
	RequestP99Ms   float64 `json:"request_p99_ms"`
	RecordP50Ms    float64 `json:"record_p50_ms"`
	RecordP99Ms    float64 `json:"record_p99_ms"`
	// Transactions, told apart by their timestamps (now() is one per
	// transaction): the relay's marks, the consumer's fan-outs and the
	// deliverer's success batches that wrote these rows.
	RelayMarks      int64 `json:"relay_marks"`
	ConsumerBatches int64 `json:"consumer_batches"`
	OutcomeBatches  int64 `json:"outcome_batches"`
}

// Minute is one minute of the run.
type Minute struct {
	Minute       int     `json:"minute"`
	Webhooks     int     `json:"webhooks"`
	LatencyP99Ms float64 `json:"latency_p99_ms"`
	// The same minute (by delivery created_at) split by stage, and the
	// CPU of the bridge process and of the whole machine in it (cores).
	Stages           Stages  `json:"stages"`
	BridgeCPUCores   float64 `json:"bridge_cpu_cores"`
	MachineBusyCores float64 `json:"machine_busy_cores"`
	// RelayP99Ms: commit → record produced over the records produced in
	// the minute; the worst second's p99 and which second it was (from the
	// load's start).
	RelayP99Ms       float64 `json:"relay_p99_ms"`
	WorstSecondP99Ms float64 `json:"worst_second_p99_ms"`
	WorstSecond      int     `json:"worst_second"`
}

// ErrShortOfRate: the writers did not commit the offered rate, so the run
// does not show the bridge at that rate (the result is still returned).
var ErrShortOfRate = relaybench.ErrShortOfRate

func (o *Options) defaults() {
	o.Rate = cmp.Or(o.Rate, 1000)
	o.Subscriptions = cmp.Or(o.Subscriptions, 3)
	o.Duration = cmp.Or(o.Duration, 5*time.Minute)
	o.Writers = cmp.Or(o.Writers, 8)
	o.TxEvents = cmp.Or(o.TxEvents, 10)
	o.Assets = cmp.Or(o.Assets, 1000)
	o.Partitions = cmp.Or(o.Partitions, 6)
	o.DrainTimeout = cmp.Or(o.DrainTimeout, 2*time.Minute)
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
}

// arrivals matches each committed event with its webhooks, and with its
// record on the topic when the topic is read (tapTopic). An event's entry
// is dropped once its commit, its record and every subscription's webhook
// have been seen (unless keep), so the bookkeeping holds the events in
// flight, not the whole run; the samples are pointer-free (16 bytes each),
// so the garbage collector of the process that receives the webhooks does
// not scan them.
type arrivals struct {
	mu      sync.Mutex
	subs    int32
	keep    bool // ExactReceiver: every event's entry stays for the run
	tapped  bool // the topic is read: an entry also waits for its record
	events  map[string]*pending
	samples []sample // commit→webhook, by arrival time
	relay   []sample // commit→record produced, by produce time; aux: produced→fetched by the bench
}

type pending struct {
	commit, kafka int64   // Unix ns; 0: not seen yet
	fetched       int64   // Unix ns the bench fetched the record
	got           int32   // webhooks received
	early         []int64 // webhooks received before the writer noted its commit
}

type sample struct {
	at      int64 // Unix ns
	ms, aux float32
}

func (a *arrivals) entry(id string) *pending {
	p := a.events[id]
	if p == nil {
		p = &pending{}
		a.events[id] = p
	}
	return p
}

// settle drops id's entry once nothing more is expected of it; a.mu held.
func (a *arrivals) settle(id string, p *pending) {
	if !a.keep && p.commit != 0 && p.got >= a.subs && (p.kafka != 0 || !a.tapped) {
		delete(a.events, id)
	}
}

func (a *arrivals) commit(ids []string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := at.UnixNano()
	for _, id := range ids {
		p := a.entry(id)
		p.commit = c
		for _, r := range p.early {
			// Received before COMMIT returned to the writer: the commit was
			// no later than the arrival.
			a.samples = append(a.samples, sample{at: r, ms: 0})
		}
		p.early = nil
		if p.kafka != 0 {
			a.relay = append(a.relay, sample{at: p.kafka, ms: float32(max(0, p.kafka-c)) / 1e6, aux: float32(max(0, p.fetched-p.kafka)) / 1e6})
		}
		a.settle(id, p)
	}
}

func (a *arrivals) received(id string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p, r := a.entry(id), at.UnixNano()
	p.got++
	if p.commit == 0 {
		p.early = append(p.early, r)
		return
	}
	a.samples = append(a.samples, sample{at: r, ms: float32(r-p.commit) / 1e6})
	a.settle(id, p)
}

// produced notes event id's record: produced at ts (its timestamp), fetched
// by the bench at fetched.
func (a *arrivals) produced(id string, ts, fetched time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.entry(id)
	if p.kafka != 0 {
		return // a record produced twice: the first counts
	}
	p.kafka, p.fetched = ts.UnixNano(), fetched.UnixNano()
	if p.commit != 0 {
		a.relay = append(a.relay, sample{at: p.kafka, ms: float32(max(0, p.kafka-p.commit)) / 1e6,
			aux: float32(max(0, fetched.Sub(ts).Seconds()*1000))})
	}
	a.settle(id, p)
}

func (a *arrivals) pendingEvents() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.events)
}

// Run performs one run on pool (a migrated database of its own, which the
// bridge process reaches at o.DatabaseURL) against the brokers of kafkaOpts.
func Run(ctx context.Context, pool *pgxpool.Pool, kafkaOpts []kgo.Opt, o Options) (*Result, error) {
	o.defaults()
	if o.Bridge == nil || o.DatabaseURL == "" {
		return nil, errors.New("pipelinebench: Bridge and DatabaseURL are required")
	}
	res := &Result{OfferedRate: o.Rate, Subscriptions: o.Subscriptions, Writers: o.Writers, TxEvents: o.TxEvents,
		Assets: o.Assets, Partitions: o.Partitions}

	kc, err := kgo.NewClient(kafkaOpts...)
	if err != nil {
		return nil, err
	}
	defer kc.Close()
	adm := kadm.NewClient(kc)
	stamp := time.Now().UnixNano()
	topic := fmt.Sprintf("bridge-bench-pipeline-%d", stamp)
	if _, err := adm.CreateTopic(ctx, o.Partitions, -1, nil, topic); err != nil {
		return nil, fmt.Errorf("create bench topic: %w", err)
	}
	defer func() { _, _ = adm.DeleteTopics(context.WithoutCancel(ctx), topic) }()

	// The receiver, one path per subscription.
	arr := &arrivals{subs: int32(o.Subscriptions), keep: o.ExactReceiver, events: map[string]*pending{}}
	rc := webhooktest.New()
	rc.Gapless = true
	rc.Bounded = !o.ExactReceiver
	res.ReceiverBounded = rc.Bounded
	rc.Observe = func(r *webhooktest.Request) {
		if r.Outcome == webhooktest.Accepted && r.Envelope.Type == "bench.live" {
			arr.received(r.WebhookID, r.Received)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: rc, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	subs := store.NewSubscriptionStore(pool, true, 0)
	for i := range o.Subscriptions {
		u := fmt.Sprintf("http://%s/s/%d", ln.Addr(), i)
		s, err := subs.Create(ctx, store.SubscriptionInput{URL: &u, EventTypes: []string{"*"}, Topic: &topic})
		if err != nil {
			return nil, err
		}
		if err := rc.SetSecret("/s/"+strconv.Itoa(i), s.Secret); err != nil {
			return nil, err
		}
	}

	// The bridge, in a process of its own.
	cmd := o.Bridge([]string{
		"DATABASE_URL=" + o.DatabaseURL,
		"CONSUMER_TOPICS=" + topic,
		"CONSUMER_GROUP=" + topic,
		"HTTP_ADDR=off",
		"WEBHOOK_ALLOWED_CIDRS=127.0.0.0/8",
		"WEBHOOK_ALLOW_HTTP=true",
		// The bench wrote its scratch subscriptions' secrets in plain text
		// (the store above has no key ring): the bridge reads them as they
		// are, and without this it would refuse to start unless the
		// caller's environment happened to carry BRIDGE_SECRET_KEYS.
		"BRIDGE_ALLOW_PLAINTEXT_SECRETS=true",
		"LOG_LEVEL=" + cmp.Or(os.Getenv("LOG_LEVEL"), "warn"),
		"WEBHOOK_FAST_LANE=" + strconv.FormatBool(o.FastLane),
		// One line per garbage collection on stderr, which stderrTap turns
		// into each second's GC figures.
		"GODEBUG=" + strings.TrimPrefix(os.Getenv("GODEBUG")+",gctrace=1", ","),
	})
	res.TracesExported, res.MetricsExported = otlpExports(cmd.Env)
	tap := &stderrTap{next: cmd.Stderr}
	cmd.Stderr = tap
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the bridge: %w", err)
	}
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = cmd.Wait(); close(exited) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			return exitErr
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			return fmt.Errorf("the bridge did not stop within 30s of SIGTERM")
		}
	}
	defer func() { _ = stop() }()
	pid := cmd.Process.Pid
	cpuBefore, cpuOK := processCPU(pid)
	began := time.Now()

	// Warm-up: one event per subscription's worth of stages — when it has
	// arrived everywhere, the consumer has joined its group and every stage
	// is running, so the load measures the pipeline, not its start.
	o.Progress("waiting for the bridge: one warm-up event through every stage")
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.EnqueueBatch(ctx, tx, []outbox.Event{{Topic: topic, AssetID: "warm-up", EventType: "bench.warmup", Payload: []byte(`{}`)}})
		return err
	}); err != nil {
		return nil, fmt.Errorf("warm-up event: %w", err)
	}
	if err := waitFor(ctx, exited, 3*time.Minute, func() bool { return rc.Stats().Accepted >= o.Subscriptions }); err != nil {
		return nil, fmt.Errorf("warm-up event not received by every subscription: %w", err)
	}

	// The warm-up load runs straight into the measured one, so the
	// pipeline is in its steady state when the measurement starts.
	warmUpEvents := 0
	if o.WarmUp > 0 {
		o.Progress(fmt.Sprintf("warming up: %d events/s for %s, not measured", o.Rate, o.WarmUp))
		warmUpEvents, _, err = relaybench.Offer(ctx, pool, relaybench.Load{Topic: topic, Assets: o.Assets, Rate: o.Rate,
			Duration: o.WarmUp, Writers: o.Writers, TxEvents: o.TxEvents, EventType: "bench.warmup"}, func([]string, time.Time) {})
		if err != nil {
			return nil, fmt.Errorf("warm-up load: %w", err)
		}
		res.WarmUpSeconds = o.WarmUp.Seconds()
	}

	// The relay's part of the latency, from the records' own timestamps.
	tapCtx, stopTap := context.WithCancel(ctx)
	defer stopTap()
	if err := tapTopic(tapCtx, kafkaOpts, topic, arr); err != nil {
		o.Progress(fmt.Sprintf("not reading the topic back (no relay split): %v", err))
	} else {
		arr.mu.Lock()
		arr.tapped = true
		arr.mu.Unlock()
	}

	o.Progress(fmt.Sprintf("offering %d events/s × %d subscriptions for %s (%d writers, %d events per transaction)",
		o.Rate, o.Subscriptions, o.Duration, o.Writers, o.TxEvents))
	loadStart := time.Now()
	cpu := sampleCPU(ctx, pid)
	pgs := samplePostgres(ctx, pool)
	rtBefore := readBenchRuntime()
	benchBefore, _ := processCPU(os.Getpid())
	pgBefore := postgresCPU()
	events, achieved, err := relaybench.Offer(ctx, pool, relaybench.Load{Topic: topic, Assets: o.Assets, Rate: o.Rate,
		Duration: o.Duration, Writers: o.Writers, TxEvents: o.TxEvents}, arr.commit)
	if err != nil {
		return nil, err
	}
	loadEnd := time.Now()
	res.LoadSeconds = loadEnd.Sub(loadStart).Seconds()
	if benchAfter, ok := processCPU(os.Getpid()); ok {
		res.BenchCPUCores = (benchAfter - benchBefore).Seconds() / res.LoadSeconds
	}
	res.PostgresCPUCores = (postgresCPU() - pgBefore).Seconds() / res.LoadSeconds
	rtAfter := readBenchRuntime()
	res.BenchGCCycles = int(rtAfter.gcCycles - rtBefore.gcCycles)
	res.BenchGCCPUCores = (rtAfter.gcCPU - rtBefore.gcCPU) / res.LoadSeconds
	res.MachineCores = goruntime.NumCPU()
	if b, e := cpu.at(loadStart), cpu.at(loadEnd); e.at.After(b.at) {
		res.MachineBusyCores = (e.machine - b.machine).Seconds() / e.at.Sub(b.at).Seconds()
	}
	res.Events, res.AchievedRate = events, achieved
	res.Webhooks = int64(events) * int64(o.Subscriptions)
	warm := int64(o.Subscriptions) * int64(1+warmUpEvents)

	// Where every stage was when the load ended.
	var sent, rows, delivered int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'SENT') FROM bridge.outbox WHERE event_type = 'bench.live'`).Scan(&sent); err != nil {
		return nil, err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'delivered') FROM bridge.deliveries WHERE event_type = 'bench.live'`).Scan(&rows, &delivered); err != nil {
		return nil, err
	}
	got := int64(rc.Stats().Accepted) - warm
	res.LagOutbox = int64(events) - sent
	res.LagConsumer = res.Webhooks - rows
	res.LagDeliveries = res.Webhooks - delivered
	res.Engine = "postgres"
	if o.FastLane {
		// No consumer: only the rows handed to the slow lane exist.
		res.Engine, res.LagConsumer, res.LagDeliveries = "kafka", 0, rows-delivered
	}
	res.LagWebhooks = res.Webhooks - got
	res.RelayPerSecond = float64(sent) / res.LoadSeconds
	res.ConsumerPerSecond = float64(rows) / res.LoadSeconds
	res.WebhooksPerSecond = float64(got) / res.LoadSeconds
	o.Progress(fmt.Sprintf("load done: %d events committed (%.0f/s); lag: outbox %d, consumer %d, deliveries %d, webhooks %d",
		events, achieved, res.LagOutbox, res.LagConsumer, res.LagDeliveries, res.LagWebhooks))

	drainErr := waitFor(ctx, exited, o.DrainTimeout, func() bool { return int64(rc.Stats().Accepted)-warm >= res.Webhooks })
	res.DrainSeconds = time.Since(loadEnd).Seconds()
	if cpuAfter, ok := processCPU(pid); ok && cpuOK {
		res.BridgeCPUCores = (cpuAfter - cpuBefore).Seconds() / time.Since(began).Seconds()
	}
	res.BridgePeakRSSMiB = peakRSS(pid)
	res.BenchPeakRSSMiB = peakRSS(os.Getpid())
	cpu.stop()
	pgs.stop()
	stopTap()
	if err := stop(); err != nil {
		return nil, fmt.Errorf("the bridge: %w", err)
	}

	st := rc.Stats()
	res.OrderViolations, res.Duplicates, res.Overlaps, res.SignatureFailures = st.OrderViolations, st.Duplicates, st.Overlaps, st.SignatureFailures
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries WHERE status <> 'delivered'`).Scan(&res.NotDelivered); err != nil {
		return nil, err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries WHERE event_type = 'bench.live'`).Scan(&res.HandedOver); err != nil {
		return nil, err
	}
	arr.mu.Lock()
	samples, relay := slices.Clone(arr.samples), slices.Clone(arr.relay)
	arr.mu.Unlock()
	gcs, logs := tap.snapshot()
	for _, g := range gcs {
		if !g.at.Before(loadStart) && !g.at.After(loadEnd) {
			res.BridgeGCCycles++
			res.BridgeGCPauseMax = max(res.BridgeGCPauseMax, g.pauseMs)
		}
	}
	relayMs := make([]float64, len(relay))
	for i, r := range relay {
		relayMs[i] = float64(r.ms)
	}
	slices.Sort(relayMs)
	res.RelayP50Ms, res.RelayP99Ms = pct(relayMs, 0.5), pct(relayMs, 0.99)
	ms := make([]float64, len(samples))
	for i, s := range samples {
		ms[i] = float64(s.ms)
	}
	slices.Sort(ms)
	res.LatencyP50Ms, res.LatencyP95Ms, res.LatencyP99Ms, res.LatencyMaxMs = pct(ms, 0.5), pct(ms, 0.95), pct(ms, 0.99), pct(ms, 1)
	last := loadEnd.Add(time.Duration(res.DrainSeconds * float64(time.Second)))
	for m := 0; loadStart.Add(time.Duration(m) * time.Minute).Before(last); m++ {
		from, to := loadStart.Add(time.Duration(m)*time.Minute), loadStart.Add(time.Duration(m+1)*time.Minute)
		xs, rs := between(samples, from, to), between(relay, from, to)
		mn := Minute{Minute: m + 1, Webhooks: len(xs), LatencyP99Ms: pct(xs, 0.99), RelayP99Ms: pct(rs, 0.99)}
		if b, e := cpu.at(from), cpu.at(to); e.at.After(b.at) {
			secs := e.at.Sub(b.at).Seconds()
			mn.BridgeCPUCores = (e.bridge - b.bridge).Seconds() / secs
			mn.MachineBusyCores = (e.machine - b.machine).Seconds() / secs
		}
		res.Minutes = append(res.Minutes, mn)
	}
	res.Seconds = perSecond(samples, relay, loadStart, cpu, gcs, logs, pgs.samples())
	for _, sc := range res.Seconds {
		if m := sc.Second / 60; m < len(res.Minutes) && sc.LatencyP99Ms > res.Minutes[m].WorstSecondP99Ms {
			res.Minutes[m].WorstSecondP99Ms, res.Minutes[m].WorstSecond = sc.LatencyP99Ms, sc.Second
		}
	}
	res.SlowestSeconds = slices.Clone(res.Seconds)
	slices.SortStableFunc(res.SlowestSeconds, func(a, b Second) int { return cmp.Compare(b.LatencyP99Ms, a.LatencyP99Ms) })
	res.SlowestSeconds = res.SlowestSeconds[:min(10, len(res.SlowestSeconds))]
	stages, err := stageLatencies(ctx, pool, loadStart, loadEnd)
	if err != nil {
		return nil, err
	}
	for _, st := range stages {
		switch {
		case st.minute < 0:
			res.Stages = st.Stages
		case st.minute < len(res.Minutes):
			res.Minutes[st.minute].Stages = st.Stages
		}
	}
	if drainErr != nil {
		return res, fmt.Errorf("not every webhook arrived within %s of the load's end (%d of %d): %w",
			o.DrainTimeout, int64(st.Accepted)-warm, res.Webhooks, drainErr)
	}
	if achieved < 0.98*float64(o.Rate) {
		return res, fmt.Errorf("%w: committed %.0f events/s of the %d offered", ErrShortOfRate, achieved, o.Rate)
	}
	return res, nil
}

// otlpExports reports whether a process with environment env (nil: this
// process's) exports spans (as tracing.ConfigFromEnv decides it) and pushes
// metrics (as metrics.OTLPReader does).
func otlpExports(env []string) (traces, metrics bool) {
	if env == nil {
		env = os.Environ()
	}
	get := func(k string) string {
		v := ""
		for _, kv := range env { // later entries win, as exec does
			if rest, ok := strings.CutPrefix(kv, k+"="); ok {
				v = strings.TrimSpace(rest)
			}
		}
		return v
	}
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return false, false
	}
	traces = !strings.EqualFold(get("OTEL_TRACES_EXPORTER"), "none") &&
		(get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_ENDPOINT") != "")
	metrics = get("OTEL_METRICS_EXPORTER") != "none" &&
		(get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_ENDPOINT") != "")
	return traces, metrics
}

// between returns the samples' milliseconds with from <= at < to, sorted.
func between(xs []sample, from, to time.Time) []float64 {
	f, t := from.UnixNano(), to.UnixNano()
	var out []float64
	for _, s := range xs {
		if s.at >= f && s.at < t {
			out = append(out, float64(s.ms))
		}
	}
	slices.Sort(out)
	return out
}

// perSecond splits the samples by the second of their arrival, and puts
// beside each second what else happened in it.
func perSecond(samples, relay []sample, loadStart time.Time, cpu *cpuSamples, gcs []bridgeGC, logs []logLine, pgs []pgSample) []Second {
	start := loadStart.UnixNano()
	var by, rby, fby [][]float64
	grow := func(b [][]float64, i int) [][]float64 {
		for len(b) <= i {
			b = append(b, nil)
		}
		return b
	}
	for _, s := range samples {
		if i := int((s.at - start) / int64(time.Second)); s.at >= start {
			by = grow(by, i)
			by[i] = append(by[i], float64(s.ms))
		}
	}
	for _, s := range relay {
		if i := int((s.at - start) / int64(time.Second)); s.at >= start {
			rby, fby = grow(rby, i), grow(fby, i)
			rby[i] = append(rby[i], float64(s.ms))
			fby[i] = append(fby[i], float64(s.aux))
		}
	}
	rby, fby = grow(rby, len(by)-1), grow(fby, len(by)-1)
	out := make([]Second, len(by))
	for i, xs := range by {
		slices.Sort(xs)
		slices.Sort(rby[i])
		slices.Sort(fby[i])
		sc := Second{Second: i, Webhooks: len(xs), LatencyP99Ms: pct(xs, 0.99), LatencyMaxMs: pct(xs, 1),
			RelayP99Ms: pct(rby[i], 0.99), KafkaFetchP99Ms: pct(fby[i], 0.99)}
		from := loadStart.Add(time.Duration(i) * time.Second)
		to := from.Add(time.Second)
		if b, e := cpu.at(from), cpu.after(to); e.at.After(b.at) {
			secs := e.at.Sub(b.at).Seconds()
			sc.BridgeCPUCores = (e.bridge - b.bridge).Seconds() / secs
			sc.MachineBusyCores = (e.machine - b.machine).Seconds() / secs
			sc.BenchCPUCores = (e.bench - b.bench).Seconds() / secs
			sc.BenchGCCycles = int(e.rt.gcCycles - b.rt.gcCycles)
			sc.BenchGCCPUMs = (e.rt.gcCPU - b.rt.gcCPU) * 1000
			sc.BenchGCPauseMs, _ = histDiff(b.rt.pauses, e.rt.pauses, pauseBuckets, 0.99)
			_, sc.BenchSchedP99Ms = histDiff(b.rt.schedLat, e.rt.schedLat, schedBuckets, 0.99)
			sc.BenchHeapMiB = float64(e.rt.heapBytes) / (1 << 20)
			sc.BenchRSSMiB, sc.BridgeRSSMiB = e.benchRSS, e.bridgeRSS
			sc.TopProcesses = topProcesses(b.procs, e.procs, secs, 5)
		}
		for _, g := range gcs {
			if g.at.Before(from) {
				sc.BridgeHeapMiB = g.heapAfterMiB
				continue
			}
			if !g.at.Before(to) {
				break
			}
			sc.BridgeGCCycles++
			sc.BridgeGCPauseMs += g.pauseMs
			sc.BridgeGCCPUMs += g.cpuMs
			sc.BridgeHeapMiB = g.heapAfterMiB
		}
		for _, l := range logs {
			if !l.at.Before(from) && l.at.Before(to) {
				sc.BridgeLog = append(sc.BridgeLog, l.line)
			}
		}
		if b, e := pgAt(pgs, from), pgAfter(pgs, to); b.ok && e.ok && e.at.After(b.at) {
			sc.CheckpointBuffers = e.checkpointBuffers - b.checkpointBuffers
			sc.BackendBuffers = e.backendBuffers - b.backendBuffers
			sc.Autovacuum, sc.PostgresWaits = b.autovacuum, b.waiting
			sc.Maintained = maintainedBetween(b.maintained, e.maintained)
			if e.autovacuum != "" && e.autovacuum != b.autovacuum {
				sc.Autovacuum = strings.TrimPrefix(b.autovacuum+"; "+e.autovacuum, "; ")
			}
		}
		out[i] = sc
	}
	return out
}

// pgAfter is the first PostgreSQL sample taken no earlier than t (the last
// one if none).
func pgAfter(xs []pgSample, t time.Time) pgSample {
	if len(xs) == 0 {
		return pgSample{}
	}
	i, _ := slices.BinarySearchFunc(xs, t, func(s pgSample, t time.Time) int { return s.at.Compare(t) })
	return xs[min(i, len(xs)-1)]
}

// pgAt is the last PostgreSQL sample taken no later than t (the first one
// if none).
func pgAt(xs []pgSample, t time.Time) pgSample {
	i, _ := slices.BinarySearchFunc(xs, t, func(s pgSample, t time.Time) int { return s.at.Compare(t) })
	if i < len(xs) && xs[i].at.Equal(t) {
		return xs[i]
	}
	if len(xs) == 0 {
		return pgSample{}
	}
	return xs[max(0, i-1)]
}

// waitFor polls cond until it holds, the bridge exits, or timeout passes.
func waitFor(ctx context.Context, exited <-chan struct{}, timeout time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			return errors.New("the bridge exited (see its log above)")
		case <-t.C:
		}
	}
	return nil
}

// pct is the p-quantile of sorted xs (0 when empty).
func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return xs[min(len(xs)-1, int(p*float64(len(xs))))]
}

// processCPU is user+system CPU of pid so far, from /proc.
func processCPU(pid int) (time.Duration, bool) {
	st, ok := readStat(pid)
	return st.cpu, ok
}

// procStat is what postgresCPU and processCPU read of /proc/<pid>/stat.
type procStat struct {
	comm string
	ppid int
	// cpu is the process's own user+system time; children that of its
	// children it has waited for (a postmaster's exited backends and
	// autovacuum workers).
	cpu, children time.Duration
}

func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, false
	}
	// Fields after the command name (which may hold spaces) in parentheses.
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return procStat{}, false
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 15 {
		return procStat{}, false
	}
	var n [5]int64 // ppid, utime, stime, cutime, cstime
	for i, j := range []int{1, 11, 12, 13, 14} {
		if n[i], err = strconv.ParseInt(f[j], 10, 64); err != nil {
			return procStat{}, false
		}
	}
	const ticks = 100 // USER_HZ on Linux
	return procStat{comm: s[open+1 : end], ppid: int(n[0]),
		cpu:      time.Duration(n[1]+n[2]) * time.Second / ticks,
		children: time.Duration(n[3]+n[4]) * time.Second / ticks}, true
}

// postgresCPU is the CPU time of this machine's PostgreSQL so far: every
// live process named postgres, plus what each postmaster's exited children
// used (backends and autovacuum workers come and go between two readings;
// their time is added to their postmaster's children's when it reaps them).
// 0 when /proc shows no PostgreSQL.
func postgresCPU() time.Duration {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	stats := map[int]procStat{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok && st.comm == "postgres" {
			stats[pid] = st
		}
	}
	var total time.Duration
	for _, st := range stats {
		total += st.cpu
		if _, child := stats[st.ppid]; !child { // a postmaster
			total += st.children
		}
	}
	return total
}

// peakRSS is VmHWM of pid in MiB (0 when /proc cannot show it).
func peakRSS(pid int) float64 { return procStatusMiB(pid, "VmHWM:") }

type minuteStages struct {
	minute int // from the load's start; -1: the whole load
	Stages
}

// stageLatencySQL splits each delivered webhook's way by stage, over the
// events committed during the load ($1, $2): minute by minute of the
// delivery row's creation, and for the whole load (minute -1). The outbox
// records no send time for events sent with their batch (sent_at is NULL),
// so the relay and consumer stages read 0 unless a row went out from the
// held rows.
const stageLatencySQL = `
WITH w AS (
  SELECT floor(extract(epoch FROM d.created_at - $1::timestamptz) / 60)::int AS minute,
         o.sent_at, d.created_at, d.delivered_at,
         extract(epoch FROM o.sent_at - o.created_at) * 1000 AS relay,
         extract(epoch FROM d.created_at - o.sent_at) * 1000 AS consumer,
         extract(epoch FROM d.delivered_at - d.created_at) * 1000 AS deliverer,
         extract(epoch FROM a.started_at - d.created_at) * 1000 AS to_request,
         a.duration_ms AS request,
         extract(epoch FROM d.delivered_at - a.started_at) * 1000 - a.duration_ms AS record
  FROM bridge.deliveries d
  JOIN bridge.outbox o ON o.id::text = d.event_id
  LEFT JOIN bridge.delivery_attempts a ON a.delivery_id = d.id AND a.attempt = 1
  WHERE d.event_type = 'bench.live' AND d.status = 'delivered' AND o.status = 'SENT'
    AND o.created_at BETWEEN $1 AND $2
)
SELECT coalesce(minute, -1),
       coalesce(percentile_disc(0.5) WITHIN GROUP (ORDER BY relay), 0), coalesce(percentile_disc(0.99) WITHIN GROUP (ORDER BY relay), 0),
       coalesce(percentile_disc(0.5) WITHIN GROUP (ORDER BY consumer), 0), coalesce(percentile_disc(0.99) WITHIN GROUP (ORDER BY consumer), 0),
       coalesce(percentile_disc(0.5) WITHIN GROUP (ORDER BY deliverer), 0), coalesce(percentile_disc(0.99) WITHIN GROUP (ORDER BY deliverer), 0),
       coalesce(percentile_disc(0.5) WITHIN GROUP (ORDER BY to_request), 0), coalesce(percentile_disc(0.99) WITHIN GROUP (ORDER BY to_request), 0),
       coalesce(percentile_disc(0.5) WITHIN GROUP (ORDER BY request), 0), coalesce(percentile_disc(0.99) WITHIN GROUP (ORDER BY request), 0),
       coalesce(percentile_disc(0.5) WITHIN GROUP (ORDER BY record), 0), coalesce(percentile_disc(0.99) WITHIN GROUP (ORDER BY record), 0),
       count(DISTINCT sent_at), count(DISTINCT created_at), count(DISTINCT delivered_at)
FROM w GROUP BY ROLLUP (minute)`

// stageLatencies runs stageLatencySQL, on fresh statistics: the read-back
// comes right after the load, and if autovacuum has not analyzed the tables
// yet (it is behind, or off) the planner sees them as they were when they
// were empty and joins every delivery to the outbox by nested loop — one
// such read-back over a 5-minute run was still going after 10 minutes. The
// tables are the bench's own (its scratch database), and the load is over.
func stageLatencies(ctx context.Context, pool *pgxpool.Pool, from, to time.Time) ([]minuteStages, error) {
	if _, err := pool.Exec(ctx, "ANALYZE bridge.outbox_log, bridge.outbox_held, bridge.deliveries, bridge.delivery_attempts"); err != nil {
		return nil, fmt.Errorf("analyze before the stage latencies: %w", err)
	}
	rows, err := pool.Query(ctx, stageLatencySQL, from, to)
	if err != nil {
		return nil, fmt.Errorf("stage latencies: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (minuteStages, error) {
		var m minuteStages
		err := r.Scan(&m.minute, &m.RelayP50Ms, &m.RelayP99Ms, &m.ConsumerP50Ms, &m.ConsumerP99Ms, &m.DelivererP50Ms, &m.DelivererP99Ms,
			&m.ToRequestP50Ms, &m.ToRequestP99Ms, &m.RequestP50Ms, &m.RequestP99Ms, &m.RecordP50Ms, &m.RecordP99Ms,
			&m.RelayMarks, &m.ConsumerBatches, &m.OutcomeBatches)
		return m, err
	})
}

// cpuSample is the bridge process's and the machine's CPU time so far, and
// what else diag.go reads once a second.
type cpuSample struct {
	at              time.Time
	bridge, machine time.Duration
	bench           time.Duration
	rt              benchRuntime
	benchRSS        float64
	bridgeRSS       float64
	procs           map[int]procUse
}

// cpuSamples holds one sample a second while the run goes on, so that
// each minute's CPU can be told apart.
type cpuSamples struct {
	mu   sync.Mutex
	xs   []cpuSample
	done chan struct{}
	once sync.Once
}

func sampleCPU(ctx context.Context, pid int) *cpuSamples {
	c := &cpuSamples{done: make(chan struct{})}
	self := os.Getpid()
	take := func() {
		b, _ := processCPU(pid)
		m, _ := machineBusy()
		bn, _ := processCPU(self)
		s := cpuSample{at: time.Now(), bridge: b, machine: m, bench: bn, rt: readBenchRuntime(),
			benchRSS: residentMiB(self), bridgeRSS: residentMiB(pid), procs: cpuByProcess(self, pid)}
		c.mu.Lock()
		c.xs = append(c.xs, s)
		c.mu.Unlock()
	}
	take()
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-c.done:
				return
			case <-t.C:
				take()
			}
		}
	}()
	return c
}

// after is the first sample taken no earlier than t (the last one if none):
// with at(from) it spans a window a sample interval may not fill.
func (c *cpuSamples) after(t time.Time) cpuSample {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.xs) == 0 {
		return cpuSample{}
	}
	i, _ := slices.BinarySearchFunc(c.xs, t, func(s cpuSample, t time.Time) int { return s.at.Compare(t) })
	return c.xs[min(i, len(c.xs)-1)]
}

func (c *cpuSamples) stop() { c.once.Do(func() { close(c.done) }) }

// at is the last sample taken no later than t (the first one if none).
func (c *cpuSamples) at(t time.Time) cpuSample {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.xs) == 0 {
		return cpuSample{}
	}
	i, _ := slices.BinarySearchFunc(c.xs, t, func(s cpuSample, t time.Time) int { return s.at.Compare(t) })
	if i < len(c.xs) && c.xs[i].at.Equal(t) {
		return c.xs[i]
	}
	return c.xs[max(0, i-1)]
}

// machineBusy is the CPU time every core of the machine spent not idle so
// far, from /proc/stat's first line (user nice system idle iowait irq
// softirq steal …).
func machineBusy() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, false
	}
	var busy int64
	for i, v := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false
		}
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(busy) * time.Second / ticks, true
}
