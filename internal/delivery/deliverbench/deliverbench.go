// Package deliverbench measures the delivery engine end to end on this
// machine: deliveries in PostgreSQL → Deliverer → an in-process loopback
// receiver (internal/webhooktest: signatures verified, duplicates, order and
// overlapping requests per (subscription, asset)). It reports the drain rate of
// a backlog, insert→received latency under a steady live load, what the
// receiver saw, peak heap while a large backlog is pending, and the machine's
// ceiling (the same HTTP client and receiver with no database).
package deliverbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/valyala/fasthttp"

	"github.com/outboxbridge/bridge/internal/bench"
	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/webhooktest"
)

// Options configure one run.
type Options struct {
	Subscriptions int
	Assets        int // per subscription
	Events        int // backlog inserted before the deliverer starts
	LiveEvents    int // inserted at LiveRate while it runs, for latency
	LiveRate      int // events per second
	Deliverer     delivery.Config
	// Replicas: deliverers running at once against the database, each with
	// its own connection pool and id, as separate `bridge deliver`
	// processes would. Default 1.
	Replicas int
	// FailingSubscriptions: that many of the subscriptions answer 500 to
	// everything; SlowSubscriptions: that many more take SlowDelay
	// (default 5s) per answer. Their deliveries are not waited for; the
	// rates, order checks and latencies are the other subscriptions'.
	FailingSubscriptions, SlowSubscriptions int
	SlowDelay                               time.Duration
	// Delivered: that many deliveries already delivered (one attempt each)
	// are in the table before the backlog, as WEBHOOK_RETENTION keeps them
	// behind a deliverer that has run for a while. Default none.
	Delivered int
	Timeout   time.Duration // whole run; default 10m
	Logger    *slog.Logger
	// Kafka, when set, runs the fast lane: Replicas members of a fresh
	// group join on a fresh, empty topic on these brokers, and once the
	// group has spread the partitions the backlog is produced to it in one
	// transaction (each record fanned out to every subscription:
	// Events/Subscriptions records); its commit starts the drain, which
	// the members deliver next to the slow lane. The live phase then
	// produces LiveEvents/Subscriptions records at LiveRate deliveries/s
	// (see fastLive).
	Kafka *FastLaneOptions
	// Profile, when set, is a path prefix: the drain of the backlog writes
	// a CPU profile of this process (Profile+".cpu") and the allocations it
	// made (Profile+".allocs", to read with Profile+".allocs.base" as
	// -diff_base).
	Profile string
}

// FastLaneOptions: the fast lane's run (see Options.Kafka).
type FastLaneOptions struct {
	KafkaOpts  []kgo.Opt // seed brokers and the rest of the connection
	Partitions int32     // of the bench's topic; default 12
	// InFlightLimit is each member's fastlane.Config.InFlightLimit
	// (WEBHOOK_FAST_LANE_IN_FLIGHT_LIMIT); "" takes the lane's default.
	InFlightLimit string
	// Member, when set, runs each member as a process of its own: Member
	// returns the `bridge deliver` command to start with env added to its
	// environment (the scratch database at DatabaseURL, the bench's topic
	// and group, WEBHOOK_FAST_LANE=true). Nil: the members run in this
	// process, each with its own pool and Kafka client but one Go runtime
	// (its scheduler and collector) for all of them and the receiver.
	Member      func(env []string) *exec.Cmd
	DatabaseURL string
	// QuietBelow, when above 0, holds the backlog's commit until the
	// machine's cores were busy less than this share over one second (the
	// members idle; at most QuietWait, default 60 s): a drain that starts
	// while another program keeps the cores busy measures that program as
	// much as the members.
	QuietBelow float64
	QuietWait  time.Duration
}

// Result is what a run measured.
type Result struct {
	Subscriptions       int     `json:"subscriptions"`
	Assets              int     `json:"assets_per_subscription"`
	Events              int     `json:"backlog_events"`
	Workers             int     `json:"workers"`
	MaxInFlightPerSub   int     `json:"max_in_flight_per_subscription"`
	InsertSeconds       float64 `json:"backlog_insert_seconds"`
	DrainSeconds        float64 `json:"backlog_drain_seconds"`
	DeliveriesPerSecond float64 `json:"deliveries_per_second"`
	LiveEvents          int     `json:"live_events"`
	LiveRate            int     `json:"live_rate_per_second"`
	LatencyP50MS        float64 `json:"latency_p50_ms"`
	LatencyP99MS        float64 `json:"latency_p99_ms"`
	LatencyMaxMS        float64 `json:"latency_max_ms"`
	OrderViolations     int64   `json:"order_violations"`
	Duplicates          int64   `json:"duplicates"`
	Overlaps            int64   `json:"overlapping_requests"`
	SignatureFailures   int64   `json:"signature_failures"`
	NotDelivered        int64   `json:"not_delivered"`
	BaselineHeapMiB     float64 `json:"baseline_heap_mib"`
	PeakHeapMiB         float64 `json:"peak_heap_mib"`
	CeilingPerSecond    float64 `json:"ceiling_http_posts_per_second"`
	// CeilingFraction is DeliveriesPerSecond / CeilingPerSecond. The
	// ceiling is an upper bound, not a target: unsigned posts to a handler
	// that answers before parsing, with no database.
	CeilingFraction float64 `json:"ceiling_fraction"`
	// What the engine did during the drain: claim statements, rows per
	// claim and time per claim; outcome batches, outcomes per batch and
	// time per batch.
	ClaimStatements  int64   `json:"claim_statements"`
	RowsPerClaim     float64 `json:"rows_per_claim"`
	ClaimMS          float64 `json:"claim_ms_avg"`
	OutcomeBatches   int64   `json:"outcome_batches"`
	OutcomesPerBatch float64 `json:"outcomes_per_batch"`
	OutcomeBatchMS   float64 `json:"outcome_batch_ms_avg"`
	Replicas         int     `json:"replicas"`
	ClaimLoops       int     `json:"claim_loops"`
	// Failing and slow subscriptions (isolation scenarios), and the most
	// requests of one subscription the receiver had at once (must not
	// exceed the cap; overlapping_requests is the per-stream check).
	FailingSubscriptions int   `json:"failing_subscriptions"`
	SlowSubscriptions    int   `json:"slow_subscriptions"`
	PeakInFlightPerSub   int64 `json:"peak_in_flight_per_subscription_seen"`
	// CPU per delivery during the drain, in microseconds: PostgreSQL's
	// backends of the run's database (0 when /proc cannot show them) and
	// this process (deliverers, receiver, bench). On a shared machine these
	// say how much work a delivery took, whatever share of the CPU the run
	// got.
	PostgresCPUMicrosPerDelivery float64 `json:"postgres_cpu_us_per_delivery"`
	ProcessCPUMicrosPerDelivery  float64 `json:"process_cpu_us_per_delivery"`
	// Delivered rows in the table before the backlog (Options.Delivered)
	// and how long inserting them took.
	RetainedDelivered     int     `json:"retained_delivered_rows"`
	RetainedInsertSeconds float64 `json:"retained_insert_seconds"`
	// LiveIntervals splits the live phase into LiveInterval-long parts
	// (the last may be shorter): whether the claim and the outcome batches
	// get dearer while the table fills with delivered rows, and the
	// latency of what arrived in each part.
	LiveIntervals []Interval `json:"live_intervals,omitempty"`
	// Engine is "postgres" (every delivery a row, claimed) or "kafka" (the
	// fast lane: the backlog in a topic, rows only for parked streams).
	Engine string `json:"engine"`
	// Row writes to the bridge's tables per delivery over the drain, from
	// pg_stat_user_tables (schema bridge) read before the backlog and once
	// the engine's connections are closed (their counters flushed). The
	// backlog's own insert is not counted.
	PostgresInsertsPerDelivery float64 `json:"postgres_inserts_per_delivery"`
	PostgresUpdatesPerDelivery float64 `json:"postgres_updates_per_delivery"`
	PostgresDeletesPerDelivery float64 `json:"postgres_deletes_per_delivery"`
	// HandedOver: deliveries the fast lane wrote to bridge.deliveries.
	HandedOver int64 `json:"handed_over_to_slow_lane"`
	// Isolations: (subscription, partition) pairs the fast lane handed to
	// the slow lane as a whole; RequestsCut: requests in flight it cut when
	// it did (their deliveries handed over, sent again with the same
	// webhook-id).
	Isolations  int64 `json:"isolations"`
	RequestsCut int64 `json:"requests_cut"`
	// GroupFormSeconds (the fast lane): how long the members took to join
	// their group and spread the topic's partitions between them, on the
	// empty topic before the backlog was produced — not part of the drain.
	GroupFormSeconds float64 `json:"group_form_seconds"`
	// FirstDeliverySeconds (the fast lane): from the commit of the
	// backlog's transaction to the first backlog delivery's arrival.
	FirstDeliverySeconds float64 `json:"first_delivery_seconds"`
	// The fast lane's in-flight limit: its mode (adaptive or fixed), the
	// sum of the members' live limits sampled every 50 ms over the drain
	// (median, lowest and highest sample), and the lowest and highest live
	// limit of any member from its start to its stop.
	InFlightLimitMode          string `json:"in_flight_limit"`
	InFlightLimitSumMedian     int64  `json:"in_flight_limit_sum_median"`
	InFlightLimitSumLowest     int64  `json:"in_flight_limit_sum_lowest"`
	InFlightLimitSumHighest    int64  `json:"in_flight_limit_sum_highest"`
	InFlightLimitMemberLowest  int64  `json:"in_flight_limit_member_lowest"`
	InFlightLimitMemberHighest int64  `json:"in_flight_limit_member_highest"`
	// MemberProcesses (the fast lane): the members ran as `bridge deliver`
	// processes of their own (FastLaneOptions.Member), and
	// MembersCPUMicrosPerDelivery is their CPU per delivery over the drain;
	// process_cpu_us_per_delivery is then this process's alone (the
	// receiver, its server and the bench). The in-flight limits and the
	// services' counts below are the in-process members' only; each
	// member's deliveries and last delivery are the receiver's for member
	// processes (see PartitionDeliveries).
	MemberProcesses             bool    `json:"member_processes"`
	MembersCPUMicrosPerDelivery float64 `json:"members_cpu_us_per_delivery"`
	// Where a drain's CPU goes beyond this process and PostgreSQL (the
	// fast lane, over the drain): the whole machine's busy CPU per
	// delivery and the share of its cores busy, and the CPU of the Kafka
	// brokers on this machine (JVMs running kafka.Kafka, 0 when none is
	// visible) per delivery.
	MachineCPUMicrosPerDelivery float64 `json:"machine_cpu_us_per_delivery"`
	MachineBusyFraction         float64 `json:"machine_busy_fraction"`
	KafkaCPUMicrosPerDelivery   float64 `json:"kafka_cpu_us_per_delivery"`
	// What ran beside the drain: the machine's busy CPU per delivery that
	// none of the measured processes (this one, the member processes,
	// PostgreSQL's backends of the run's database, the brokers) spent —
	// another program, kernel threads, PostgreSQL's own background
	// processes (as member processes only: in-process members are in this
	// process) — and the share of the machine's cores busy over the second
	// before the backlog's commit, when the members have nothing to do.
	// A run whose figure is high shared the cores with something else.
	UnattributedCPUMicrosPerDelivery float64 `json:"unattributed_cpu_us_per_delivery"`
	MachineBusyBeforeFraction        float64 `json:"machine_busy_before_fraction"`
	// QuietWaitSeconds: how long the commit waited for the machine to be
	// quiet (FastLaneOptions.QuietBelow); QuietTimedOut: it was not quiet
	// within QuietWait and the drain started anyway.
	QuietWaitSeconds float64 `json:"quiet_wait_seconds"`
	QuietTimedOut    bool    `json:"quiet_timed_out"`
	// This process's Go runtime over the drain: garbage collections, the
	// collector's CPU per delivery, the share of its Ps' time idle (of
	// /cpu/classes/total: the runtime's estimate, brought up to date at
	// each collection), the
	// median and 99th percentile of how long a runnable goroutine waited
	// for a P (runtime/metrics /sched/latencies, upper bucket bounds), and
	// that histogram's samples per delivery (the runtime samples one
	// goroutine transition in several: a relative count of hand-offs).
	GCCycles                int64   `json:"gc_cycles"`
	GCCPUMicrosPerDelivery  float64 `json:"gc_cpu_us_per_delivery"`
	GoIdleFraction          float64 `json:"go_idle_fraction"`
	SchedLatencyP50Micros   float64 `json:"sched_latency_p50_us"`
	SchedLatencyP99Micros   float64 `json:"sched_latency_p99_us"`
	SchedSamplesPerDelivery float64 `json:"sched_samples_per_delivery"`
	// The members' own services over the drain (summed): polls that
	// returned records, attempt-log appends and attempts per append,
	// offset commits; and per member, its deliveries and when (from the
	// backlog's commit) the last of them was seen (sampled every 50 ms):
	// a member that ends well after the others drains alone at the end.
	Polls                  int64   `json:"polls"`
	AttemptLogFlushes      int64   `json:"attempt_log_flushes"`
	AttemptLogRowsPerFlush float64 `json:"attempt_log_rows_per_flush"`
	OffsetCommits          int64   `json:"offset_commits"`
	// RouteChecks: checks of the subscriptions' version over the drain
	// (summed); a backlog older than the members' routes needs none
	// (docs/architecture.md, "Which subscriptions a record goes to").
	RouteChecks       int64     `json:"route_checks"`
	MemberDeliveries  []int64   `json:"member_deliveries,omitempty"`
	MemberDoneSeconds []float64 `json:"member_done_seconds,omitempty"`
	// What the receiver saw per partition of the bench topic (the fast
	// lane, both ways of running the members): each partition's backlog
	// deliveries; per member (in-process: the lanes' order; as processes:
	// the group's members in member-id order, and member_deliveries /
	// member_done_seconds are then the receiver's counts in 100-ms
	// buckets) the partitions it owned at the backlog's commit and its
	// longest run of 100-ms buckets without a delivery between its first
	// and its last (a rebalance, a stall), and its deliveries in each half
	// second from the backlog's commit; and whether the group's
	// assignment at the drain's end differed from the one at its start.
	PartitionDeliveries        []int64   `json:"partition_deliveries,omitempty"`
	MemberPartitions           []int     `json:"member_partitions,omitempty"`
	MemberLongestGapSeconds    []float64 `json:"member_longest_gap_seconds,omitempty"`
	MemberTimeline             [][]int64 `json:"member_deliveries_per_half_second,omitempty"`
	GroupReassignedDuringDrain bool      `json:"group_reassigned_during_drain"`
}

// LiveInterval is the length of one of Result.LiveIntervals.
const LiveInterval = 30 * time.Second

// Interval is one part of the live phase: the engine's claim and outcome
// figures (all replicas) and the latency of the live requests received.
type Interval struct {
	FromSeconds     float64 `json:"from_s"`
	ClaimStatements int64   `json:"claim_statements"`
	RowsPerClaim    float64 `json:"rows_per_claim"`
	ClaimMS         float64 `json:"claim_ms_avg"`
	OutcomeBatches  int64   `json:"outcome_batches"`
	OutcomeBatchMS  float64 `json:"outcome_batch_ms_avg"`
	Received        int     `json:"received"`
	LatencyP50MS    float64 `json:"latency_p50_ms"`
	LatencyP99MS    float64 `json:"latency_p99_ms"`
}

// payload is what each delivery carries: the insert time, for latency.
type payload struct {
	T    int64  `json:"t"`
	Live bool   `json:"live,omitempty"`
	Pad  string `json:"pad"`
}

// receiver is webhooktest's receiver with the bench's bookkeeping: how many
// backlog and live events arrived, the insert→received latency of the live
// ones, and the most requests one subscription had in flight at once. It
// also plays the failing (500 to everything) and slow subscriptions of the
// isolation scenarios, /s/0 … /s/failing-1 and the next slow ones; their
// events are not counted. Every stream starts at asset_seq 1 and has no gaps
// (Gapless): the bench inserts every event of every asset.
type receiver struct {
	*webhooktest.Receiver
	unhealthy int // subscriptions below this index fail or are slow
	// subs are the subscriptions' names ("/s/0" …), made once: a request's
	// Subscription is one of them, not a string built per request.
	subs      []string
	mu        sync.Mutex
	latencies []time.Duration
	busy      []atomic.Int64 // requests in flight, per subscription
	peakSub   atomic.Int64
	backlog   atomic.Int64
	// firstBacklog is when the first backlog event arrived (UnixNano; 0:
	// none yet).
	firstBacklog atomic.Int64
	live         atomic.Int64
	// meter counts the backlog's deliveries per partition (the fast lane;
	// nil: not counted).
	meter atomic.Pointer[partitionMeter]
}

func newReceiver(subscriptions, failing, slow int, slowDelay time.Duration) *receiver {
	rc := &receiver{Receiver: webhooktest.New(), unhealthy: failing + slow, busy: make([]atomic.Int64, subscriptions)}
	for i := range subscriptions {
		rc.subs = append(rc.subs, "/s/"+strconv.Itoa(i))
	}
	index := func(sub string) int {
		n, _ := strconv.Atoi(strings.TrimPrefix(sub, "/s/"))
		return n
	}
	rc.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		switch n := index(r.Subscription); {
		case n < failing:
			return http.StatusInternalServerError, 0
		case n < failing+slow:
			return http.StatusNoContent, slowDelay
		}
		return http.StatusNoContent, 0
	}
	rc.Gapless = true
	rc.Observe = func(r *webhooktest.Request) {
		if r.Outcome != webhooktest.Accepted || index(r.Subscription) < rc.unhealthy {
			return
		}
		// A backlog event's payload has no "live" field (omitempty): only
		// a live one is decoded, for its insert time.
		var p payload
		if bytes.Contains(r.Envelope.Data, []byte(`"live":`)) {
			if err := json.Unmarshal(r.Envelope.Data, &p); err != nil {
				return
			}
		}
		if p.Live {
			rc.mu.Lock()
			rc.latencies = append(rc.latencies, r.Received.Sub(time.Unix(0, p.T)))
			rc.mu.Unlock()
			rc.live.Add(1)
		} else {
			if rc.backlog.Add(1) == 1 {
				rc.firstBacklog.Store(r.Received.UnixNano())
			}
			if m := rc.meter.Load(); m != nil {
				m.observe(r.Envelope.AssetID, r.Received)
			}
		}
	}
	return rc
}

// ceilingPath answers 204 without looking at the request: the ceiling's
// endpoint.
const ceilingPath = "/ceiling"

// serve is the bench's HTTP server: the receiver at /s/<n>, the ceiling's
// endpoint at /ceiling. It is fasthttp's server, not net/http's: both run
// in the process being measured, on the cores PostgreSQL and the broker
// use, and net/http's server (a goroutine, a buffered reader and writer, a
// header map and a context per request) was about a third of what the
// process spent per delivery. The receiver's checks are the same
// (webhooktest.Receiver.Handle, every signature verified); only the server
// around them is leaner.
func (rc *receiver) serve(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	if string(path) == ceilingPath {
		ctx.SetStatusCode(http.StatusNoContent)
		return
	}
	if !bytes.HasPrefix(path, []byte("/s/")) {
		ctx.SetStatusCode(http.StatusNotFound)
		return
	}
	// The requests in flight to the subscription, for as long as each runs
	// (slow answers included).
	var busy *atomic.Int64
	in := webhooktest.Incoming{Method: http.MethodPost, Done: ctx.Done()}
	if n, err := strconv.Atoi(string(path[len("/s/"):])); err == nil && n >= 0 && n < len(rc.subs) && string(path) == rc.subs[n] {
		in.Subscription, busy = rc.subs[n], &rc.busy[n]
		now := busy.Add(1)
		for peak := rc.peakSub.Load(); now > peak && !rc.peakSub.CompareAndSwap(peak, now); peak = rc.peakSub.Load() {
		}
		defer busy.Add(-1)
	} else {
		in.Subscription = string(path)
	}
	if !ctx.IsPost() {
		in.Method = string(ctx.Method())
	}
	h := &ctx.Request.Header
	in.WebhookID = string(h.Peek(contract.HeaderWebhookID))
	in.Timestamp = string(h.Peek(contract.HeaderWebhookTimestamp))
	in.Signature = string(h.Peek(contract.HeaderWebhookSignature))
	in.Traceparent = string(h.Peek(contract.HeaderTraceparent))
	// The receiver keeps the body; fasthttp reuses its buffer.
	in.Body = bytes.Clone(ctx.PostBody())
	status, msg := rc.Handle(&in)
	ctx.SetStatusCode(status)
	if status < 200 || status >= 300 {
		ctx.SetBodyString(msg)
	}
}

// listen starts the bench's server on a loopback port; stop closes it.
func (rc *receiver) listen() (base string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("listen: %w", err)
	}
	srv := &fasthttp.Server{
		Handler:               rc.serve,
		MaxRequestBodySize:    int(rc.MaxBodyBytes()),
		ReadTimeout:           time.Minute,
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
		CloseOnShutdown:       true,
	}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.ShutdownWithContext(ctx)
	}, nil
}

// Run performs one benchmark on pool, which must be a migrated database of
// its own (the run adds subscriptions and deliveries to it).
func Run(ctx context.Context, pool *pgxpool.Pool, o Options) (*Result, error) {
	if o.Subscriptions < 1 || o.Assets < 1 || o.Events < 0 || o.LiveEvents < 0 {
		return nil, errors.New("subscriptions and assets must be at least 1, events not negative")
	}
	if o.LiveRate <= 0 {
		o.LiveRate = 500
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()

	if o.Delivered < 0 {
		return nil, errors.New("delivered rows must not be negative")
	}
	if o.FailingSubscriptions < 0 || o.SlowSubscriptions < 0 || o.FailingSubscriptions+o.SlowSubscriptions >= o.Subscriptions {
		return nil, errors.New("failing and slow subscriptions must leave at least one healthy subscription")
	}
	o.Replicas = max(o.Replicas, 1)
	if o.SlowDelay <= 0 {
		o.SlowDelay = 5 * time.Second
	}
	rc := newReceiver(o.Subscriptions, o.FailingSubscriptions, o.SlowSubscriptions, o.SlowDelay)
	base, stopServer, err := rc.listen()
	if err != nil {
		return nil, err
	}
	defer stopServer()

	dc := o.Deliverer
	dc.AllowedCIDRs = append(slices.Clone(dc.AllowedCIDRs), netip.MustParsePrefix("127.0.0.0/8"))
	dc.Workers = max(dc.Workers, 1)
	dc.MaxInFlightPerSubscription = max(dc.MaxInFlightPerSubscription, 1)
	dc.Logger = logger
	res := &Result{Engine: "postgres", Subscriptions: o.Subscriptions, Assets: o.Assets, Events: o.Events, LiveEvents: o.LiveEvents,
		LiveRate: o.LiveRate, Workers: dc.Workers, MaxInFlightPerSub: dc.MaxInFlightPerSubscription,
		Replicas: o.Replicas, ClaimLoops: dc.ClaimLoops, FailingSubscriptions: o.FailingSubscriptions,
		SlowSubscriptions: o.SlowSubscriptions}
	// healthy counts the deliveries of [from, from+n) that go to healthy
	// subscriptions (rows go round-robin over the subscriptions).
	unhealthy := o.FailingSubscriptions + o.SlowSubscriptions
	healthy := func(from, n int) int64 {
		var c int64
		for i := from; i < from+n; i++ {
			if i%o.Subscriptions >= unhealthy {
				c++
			}
		}
		return c
	}

	// The machine's ceiling: the same client and receiver, no database.
	res.CeilingPerSecond = ceiling(ctx, delivery.NewHTTPClient(dc.AllowedCIDRs, nil, dc.Workers), base+ceilingPath, dc.Workers)
	logger.InfoContext(ctx, "ceiling measured", "http_posts_per_second", int(res.CeilingPerSecond))

	subs := store.NewSubscriptionStore(pool, true, 0)
	subIDs := make([]string, o.Subscriptions)
	for i := range subIDs {
		u := fmt.Sprintf("%s/s/%d", base, i)
		s, err := subs.Create(ctx, store.SubscriptionInput{URL: &u, EventTypes: []string{"*"}})
		if err != nil {
			return nil, err
		}
		subIDs[i] = s.ID
		if err := rc.SetSecret("/s/"+strconv.Itoa(i), s.Secret); err != nil {
			return nil, err
		}
	}
	if o.Kafka != nil {
		o.Logger = logger
		return runFast(ctx, pool, o, dc, rc, res, subIDs, unhealthy)
	}
	seqs := map[string]int64{}
	pad := strings.Repeat("x", 160)
	nextRows := func(from, n int, live bool) []store.Pending {
		rows := make([]store.Pending, 0, n)
		t := time.Now().UnixNano()
		for i := from; i < from+n; i++ {
			s := i % o.Subscriptions
			asset := "asset-" + strconv.Itoa((i/o.Subscriptions)%o.Assets)
			key := subIDs[s] + "|" + asset
			seqs[key]++
			seq := seqs[key]
			p, _ := json.Marshal(payload{T: t, Live: live, Pad: pad})
			rows = append(rows, store.Pending{SubscriptionID: subIDs[s], Event: store.Event{
				ID: fmt.Sprintf("bench-%d-%v", i, live), Type: "bench.event", Topic: "bench", AssetID: &asset,
				AssetSeq: &seq, Payload: string(p), CreatedAt: time.Now()}})
		}
		return rows
	}

	if o.Delivered > 0 {
		start := time.Now()
		p, _ := json.Marshal(payload{T: start.UnixNano(), Pad: pad})
		if err := store.InsertRetained(ctx, pool, subIDs, o.Assets, o.Delivered, string(p)); err != nil {
			return nil, err
		}
		res.RetainedDelivered, res.RetainedInsertSeconds = o.Delivered, time.Since(start).Seconds()
		logger.InfoContext(ctx, "retained delivered rows inserted", "rows", o.Delivered, "elapsed_seconds", res.RetainedInsertSeconds)
	}
	start := time.Now()
	for from := 0; from < o.Events; from += 10000 {
		n := min(10000, o.Events-from)
		if err := store.CopyPending(ctx, pool, nextRows(from, n, false)); err != nil {
			return nil, fmt.Errorf("insert backlog: %w", err)
		}
	}
	res.InsertSeconds = time.Since(start).Seconds()
	logger.InfoContext(ctx, "backlog inserted", "events", o.Events, "elapsed_seconds", res.InsertSeconds)

	pool.Reset() // every backend so far exits and reports its counters
	writesBefore, err := settledRowWrites(ctx, pool)
	if err != nil {
		return nil, err
	}
	res.BaselineHeapMiB = bench.MiB(bench.HeapInuseNow())
	heap := bench.WatchHeap(20 * time.Millisecond)

	var ds []*delivery.Deliverer
	for r := range o.Replicas {
		p := pool
		if r > 0 {
			if p, err = pgxpool.NewWithConfig(ctx, pool.Config().Copy()); err != nil {
				heap.Stop()
				return nil, fmt.Errorf("replica pool: %w", err)
			}
			defer p.Close()
		}
		rcfg := dc
		rcfg.ID = fmt.Sprintf("bench-replica-%d", r+1)
		d, err := delivery.NewDeliverer(p, rcfg)
		if err != nil {
			heap.Stop()
			return nil, err
		}
		ds = append(ds, d)
	}
	set := ds[0].Settings()
	res.ClaimLoops, res.Workers, res.MaxInFlightPerSub = set.ClaimLoops, set.Workers, set.MaxInFlightPerSubscription
	runCtx, stopDeliverer := context.WithCancel(ctx)
	runErr := make(chan error, len(ds))
	dbName := pool.Config().ConnConfig.Database
	pgBefore, pgOK := postgresCPU(dbName)
	selfBefore := selfCPU()
	start = time.Now()
	for _, d := range ds {
		go func() { runErr <- d.Run(runCtx) }()
	}
	stop := func() error {
		stopDeliverer()
		var errs []error
		for range ds {
			errs = append(errs, <-runErr)
		}
		return errors.Join(errs...)
	}
	wantBacklog := healthy(0, o.Events)

	if err := waitUntil(ctx, func() bool { return rc.backlog.Load() >= wantBacklog }); err != nil {
		heap.Stop()
		_ = stop()
		return nil, fmt.Errorf("backlog not delivered (%d of %d): %w", rc.backlog.Load(), wantBacklog, err)
	}
	res.DrainSeconds = time.Since(start).Seconds()
	if res.DrainSeconds > 0 {
		res.DeliveriesPerSecond = float64(wantBacklog) / res.DrainSeconds
	}
	if pgAfter, ok := postgresCPU(dbName); ok && pgOK && wantBacklog > 0 {
		res.PostgresCPUMicrosPerDelivery = float64((pgAfter - pgBefore).Microseconds()) / float64(o.Events)
	}
	if o.Events > 0 {
		res.ProcessCPUMicrosPerDelivery = float64((selfCPU() - selfBefore).Microseconds()) / float64(o.Events)
	}
	if res.CeilingPerSecond > 0 {
		res.CeilingFraction = res.DeliveriesPerSecond / res.CeilingPerSecond
	}
	sum := func() delivery.Stats {
		var st delivery.Stats
		for _, d := range ds {
			x := d.Stats()
			st.Claims, st.Claimed, st.ClaimTime = st.Claims+x.Claims, st.Claimed+x.Claimed, st.ClaimTime+x.ClaimTime
			st.Records, st.Recorded, st.RecordTime = st.Records+x.Records, st.Recorded+x.Recorded, st.RecordTime+x.RecordTime
		}
		return st
	}
	st := sum()
	res.ClaimStatements, res.OutcomeBatches = st.Claims, st.Records
	if st.Claims > 0 {
		res.RowsPerClaim = float64(st.Claimed) / float64(st.Claims)
		res.ClaimMS = st.ClaimTime.Seconds() * 1000 / float64(st.Claims)
	}
	if st.Records > 0 {
		res.OutcomesPerBatch = float64(st.Recorded) / float64(st.Records)
		res.OutcomeBatchMS = st.RecordTime.Seconds() * 1000 / float64(st.Records)
	}
	res.PeakHeapMiB = bench.MiB(heap.Stop())
	logger.InfoContext(ctx, "backlog drained", "elapsed_seconds", res.DrainSeconds, "per_second", int(res.DeliveriesPerSecond))
	if o.LiveEvents == 0 && o.Events > 0 {
		// The drain's row writes (with a live phase they would include its
		// inserts, so they are counted only without one).
		if err := stop(); err != nil {
			return nil, err
		}
		stop = func() error { return nil }
		pool.Reset()
		after, err := settledRowWrites(ctx, pool)
		if err != nil {
			return nil, err
		}
		n := float64(o.Events)
		res.PostgresInsertsPerDelivery = float64(after.ins-writesBefore.ins) / n
		res.PostgresUpdatesPerDelivery = float64(after.upd-writesBefore.upd) / n
		res.PostgresDeletesPerDelivery = float64(after.del-writesBefore.del) / n
	}

	// Live phase: small transactions at a steady rate, latency measured from
	// just before each insert to the request's arrival.
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	if o.LiveEvents > 0 {
		tick := 10 * time.Millisecond
		perTick := max(1, o.LiveRate/100)
		t := time.NewTicker(tick)
		liveStart := time.Now()
		from, fromStats := liveStart, sum()
		rc.mu.Lock()
		fromLat := len(rc.latencies)
		rc.mu.Unlock()
		interval := func(now time.Time) {
			x := sum()
			iv := Interval{FromSeconds: from.Sub(liveStart).Seconds(),
				ClaimStatements: x.Claims - fromStats.Claims, OutcomeBatches: x.Records - fromStats.Records}
			if iv.ClaimStatements > 0 {
				iv.RowsPerClaim = float64(x.Claimed-fromStats.Claimed) / float64(iv.ClaimStatements)
				iv.ClaimMS = (x.ClaimTime - fromStats.ClaimTime).Seconds() * 1000 / float64(iv.ClaimStatements)
			}
			if iv.OutcomeBatches > 0 {
				iv.OutcomeBatchMS = (x.RecordTime - fromStats.RecordTime).Seconds() * 1000 / float64(iv.OutcomeBatches)
			}
			rc.mu.Lock()
			lat := slices.Clone(rc.latencies[fromLat:])
			fromLat = len(rc.latencies)
			rc.mu.Unlock()
			if iv.Received = len(lat); len(lat) > 0 {
				slices.Sort(lat)
				iv.LatencyP50MS, iv.LatencyP99MS = ms(lat[len(lat)*50/100]), ms(lat[min(len(lat)-1, len(lat)*99/100)])
			}
			res.LiveIntervals = append(res.LiveIntervals, iv)
			from, fromStats = now, x
		}
		for sent := 0; sent < o.LiveEvents; {
			now := <-t.C
			if now.Sub(from) >= LiveInterval {
				interval(now)
			}
			n := min(perTick, o.LiveEvents-sent)
			if err := store.CopyPending(ctx, pool, nextRows(o.Events+sent, n, true)); err != nil {
				t.Stop()
				_ = stop()
				return nil, fmt.Errorf("insert live events: %w", err)
			}
			sent += n
		}
		t.Stop()
		wantLive := healthy(o.Events, o.LiveEvents)
		if err := waitUntil(ctx, func() bool { return rc.live.Load() >= wantLive }); err != nil {
			_ = stop()
			return nil, fmt.Errorf("live events not delivered (%d of %d): %w", rc.live.Load(), wantLive, err)
		}
		interval(time.Now())
		rc.mu.Lock()
		lat := slices.Clone(rc.latencies)
		rc.mu.Unlock()
		slices.Sort(lat)
		res.LatencyP50MS = ms(lat[len(lat)*50/100])
		res.LatencyP99MS = ms(lat[min(len(lat)-1, len(lat)*99/100)])
		res.LatencyMaxMS = ms(lat[len(lat)-1])
	}
	if err := stop(); err != nil {
		return nil, err
	}
	rs := rc.Stats()
	res.OrderViolations = int64(rs.OrderViolations)
	res.Duplicates = int64(rs.Duplicates)
	res.Overlaps = int64(rs.Overlaps)
	res.SignatureFailures = int64(rs.SignatureFailures)
	if res.NotDelivered, err = store.NotDelivered(ctx, pool, subIDs[unhealthy:]); err != nil {
		return nil, err
	}
	res.PeakInFlightPerSub = rc.peakSub.Load()
	return res, nil
}

func waitUntil(ctx context.Context, cond func() bool) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// ceiling posts to the receiver from `workers` goroutines for two seconds
// through the webhook client: what this machine's HTTP path allows with no
// database in the way.
func ceiling(ctx context.Context, client *http.Client, url string, workers int) float64 {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var n atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	body := strings.Repeat("x", 300)
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}
