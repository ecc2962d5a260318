package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/service"
	"github.com/outboxbridge/bridge/internal/tracing"
)

// notifyChannel is where the deliveries trigger announces new rows.
const notifyChannel = "bridge_deliveries"

// queryTimeout bounds one bookkeeping query, so a stuck statement cannot
// stall a loop forever.
const queryTimeout = 30 * time.Second

// Deliverer claims deliveries and sends them with a pool of workers. Several
// Deliverers (processes or replicas) can run against one database: the claim
// keeps per-(subscription, asset) order across all of them.
type Deliverer struct {
	pool   *pgxpool.Pool
	cfg    Config
	store  *store.DeliveryStore
	client *http.Client
	log    *slog.Logger
	tracer trace.Tracer

	// wakes has one channel per claim loop: anything that may have made work
	// claimable (a NOTIFY, a written outcome, a reclaim) pokes them all.
	wakes []chan struct{}
	// inFlight counts claims out: queued, in a request, or waiting for
	// their outcome to be written.
	inFlight atomic.Int64
	// bytesOut is the payload bytes of those claims: bounded by ClaimBytes
	// (plus at most one payload per claim loop), whatever the payload sizes.
	bytesOut atomic.Int64
	running  atomic.Bool
	// starved is set when a claim loop found no free slot; whoever gives
	// slots back then wakes the loops (see reserve).
	starved atomic.Bool
	stats   counters
}

// counters are the engine's own figures (Stats).
type counters struct {
	progress                       atomic.Int64 // see Progress
	claims, claimed, claimNanos    atomic.Int64
	records, recorded, recordNanos atomic.Int64
}

// Stats are the engine's figures since it started: how many claim
// statements ran, how many rows they returned and how long they took, and
// the same for outcome batches. A benchmark reads them to say where the time
// goes.
type Stats struct {
	Claims, Claimed, Records, Recorded int64
	ClaimTime, RecordTime              time.Duration
}

// Stats returns the engine's figures so far.
func (d *Deliverer) Stats() Stats {
	return Stats{
		Claims: d.stats.claims.Load(), Claimed: d.stats.claimed.Load(),
		Records: d.stats.records.Load(), Recorded: d.stats.recorded.Load(),
		ClaimTime: time.Duration(d.stats.claimNanos.Load()), RecordTime: time.Duration(d.stats.recordNanos.Load()),
	}
}

// outcomeQueues are the recorders' inputs (see Run).
type outcomeQueues struct{ delivered, retries chan recorded }

// recorded is a success or retry on its way to the recorder.
type recorded struct {
	res    store.Result
	ctx    context.Context
	status int
}

// NewDeliverer returns a Deliverer on pool; zero fields of cfg take their
// defaults. `bridge deliver` and `bridge run` both start one.
func NewDeliverer(pool *pgxpool.Pool, cfg Config) (*Deliverer, error) {
	cfg = cfg.withDefaults()
	if cfg.Lease <= cfg.Timeout {
		return nil, fmt.Errorf("webhook lease (%s) must be longer than the request timeout (%s): a claim must not expire while its request can still be running", cfg.Lease, cfg.Timeout)
	}
	wakes := make([]chan struct{}, cfg.ClaimLoops)
	for i := range wakes {
		wakes[i] = make(chan struct{}, 1)
	}
	d := &Deliverer{
		wakes:  wakes,
		pool:   pool,
		cfg:    cfg,
		store:  store.NewDeliveryStore(pool).WithKeys(cfg.Keys),
		client: NewHTTPClient(cfg.AllowedCIDRs, cfg.TracerProvider, cfg.Workers),
		log:    cfg.Logger.With("component", "deliverer", "deliverer_id", cfg.ID),
		tracer: tracerProvider(cfg.TracerProvider).Tracer("github.com/outboxbridge/bridge/internal/delivery"),
	}
	d.store.Operations = cfg.OperationsTopic
	for _, p := range cfg.AllowedCIDRs {
		// An exemption covering a whole address family turns the SSRF
		// guard off for it without a word: every subscription could then
		// reach the cloud metadata endpoint, localhost and the private
		// network. Allowed (a lab may want it), but never silently.
		if p.Bits() == 0 {
			family := "IPv6"
			if p.Addr().Is4() {
				family = "IPv4"
			}
			d.log.Warn(fmt.Sprintf("WEBHOOK_ALLOWED_CIDRS contains %s: the SSRF guard is off for every %s address "+
				"(loopback, private networks, cloud metadata endpoints); list only the ranges your endpoints need", p, family),
				"variable", "WEBHOOK_ALLOWED_CIDRS", "cidr", p.String())
		}
	}
	return d, nil
}

// Settings is the deliverer's configuration, defaults applied.
func (d *Deliverer) Settings() Config { return d.cfg }

// ID is what this deliverer writes in claimed_by.
func (d *Deliverer) ID() string { return d.cfg.ID }

func (d *Deliverer) poke() {
	for _, w := range d.wakes {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// Run delivers until ctx is cancelled, then shuts down gracefully: it stops
// claiming, gives requests in flight ShutdownGrace to finish (their outcome is
// recorded), cancels the rest and releases every claim it still holds without
// charging the attempt — a deploy must not look like a failing endpoint. It
// returns nil after a clean shutdown.
func (d *Deliverer) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("deliverer is already running")
	}
	defer d.running.Store(false)

	// Requests run under their own context: cancelling ctx stops claiming,
	// not the requests already sent. That one is cancelled ShutdownGrace
	// later.
	reqCtx, cancelReqs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReqs()

	// Room for every claim out: capacity, plus the slots lent by slow
	// requests (at most one per worker, see sendLending).
	jobs := make(chan store.Claim, d.capacity()+d.cfg.Workers)
	// Two recorders: successes (committed without waiting for the WAL
	// flush) and retries (which wait for it). With one, a failing
	// subscription put a retry in nearly every batch, every batch waited for
	// its flush, and the other subscriptions' successes queued behind them.
	// Their rows never overlap: a stream has one delivery in flight, and a
	// retry does not touch its subscription's row.
	results := outcomeQueues{
		delivered: make(chan recorded, d.capacity()),
		retries:   make(chan recorded, d.capacity()),
	}
	var workers, recorder, loops sync.WaitGroup
	for range d.cfg.Workers {
		workers.Go(func() {
			for c := range jobs {
				if !d.process(ctx, reqCtx, c, results) {
					d.done(1, int64(c.PayloadBytes))
				}
			}
		})
	}
	for range successRecorders {
		recorder.Go(func() { d.recordLoop(results.delivered) })
	}
	recorder.Go(func() { d.recordLoop(results.retries) })
	loops.Go(func() {
		notified := make(chan struct{}, 1)
		go service.Listen(ctx, service.Listener{Pool: d.pool, Channel: notifyChannel, Logger: d.log}, notified)
		for {
			select {
			case <-ctx.Done():
				return
			case <-notified:
				d.poke()
			}
		}
	})
	loops.Go(func() {
		service.Every(ctx, service.Loop{Name: "reclaim stalled deliveries", Interval: d.cfg.ReclaimInterval,
			Timeout: queryTimeout, Logger: d.log}, d.reclaim)
	})
	loops.Go(func() {
		service.Every(ctx, service.Loop{Name: "delivery retention", Interval: d.cfg.PruneInterval, Logger: d.log}, d.prune)
	})
	loops.Go(func() {
		service.Every(ctx, service.Loop{Name: "subscription history", Interval: d.cfg.PollInterval, Logger: d.log,
			Immediate: true}, d.copyHistory)
	})

	d.log.InfoContext(ctx, "delivering", "workers", d.cfg.Workers, "max_in_flight_per_subscription", d.cfg.MaxInFlightPerSubscription,
		"poll_interval", d.cfg.PollInterval, "lease", d.cfg.Lease, "max_attempts", d.cfg.maxAttempts())
	var claimers sync.WaitGroup
	for i := range d.cfg.ClaimLoops {
		claimers.Go(func() { d.claimLoop(ctx, jobs, i) })
	}
	claimers.Wait()

	// Shutdown.
	d.log.InfoContext(ctx, "stopping: no new claims; waiting for requests in flight", "in_flight", d.inFlight.Load(), "grace", d.cfg.ShutdownGrace)
	grace := time.AfterFunc(d.cfg.ShutdownGrace, cancelReqs)
	close(jobs)
	workers.Wait()
	grace.Stop()
	// Every outcome is written before the claims still held are released:
	// releasing one whose answer is waiting in the recorder would send it
	// again and un-charge an attempt that was made.
	close(results.delivered)
	close(results.retries)
	recorder.Wait()
	loops.Wait()
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), queryTimeout)
	defer cancel()
	n, err := d.store.ReleaseAll(bctx, d.cfg.ID)
	if err != nil {
		// The leases bring them back after WEBHOOK_LEASE.
		d.log.ErrorContext(bctx, "release claims at shutdown failed; they return when their lease expires", "err", err)
	} else if n > 0 {
		d.log.InfoContext(bctx, "released claims without charging their attempt", "released", n)
	}
	d.client.CloseIdleConnections()
	d.log.InfoContext(bctx, "stopped")
	return nil
}

// capacity is how many claims may be out at once: two per worker — one in
// a request, one queued or waiting for its outcome to be written. The claim
// statement costs about the same for 5 rows as for 30, and the claim loop is
// serial, so claiming only for idle workers made it the bottleneck (a claim
// returned the few workers that freed up during the previous one). The
// queue is bounded, so memory stays bounded by the worker count, whatever
// the backlog; queued claims hold only rows that are their stream's next
// anyway.
func (d *Deliverer) capacity() int { return 2 * d.cfg.Workers }

// claimLinger is the longest wait between two claims of one loop while
// claims are out and the last claim was lean, fewFreeLinger while claims
// are out and fewer than a quarter of the slots are free (see claimGap:
// the wait is no longer than the loop's claims have lately taken, so only
// a loaded machine waits this long). With nothing out a loop claims at
// once: an idle deliverer adds no latency.
//
// 20 ms rather than 5: a claim costs about the same for 5 rows as for 30
// (the locks, the window of streams, the commit), and on a saturated
// machine that fixed cost is what the other stages wait for. In bench
// pipeline (1,000 events/s × 3 subscriptions, 2 cores busy), 20 ms here
// and recordEvery together took PostgreSQL's CPU for the bridge from 0.90
// to 0.76 cores (one run each). The price is the per-subscription slot cycle: a slot
// freed by an outcome is claimed again up to claimLinger later, so one
// subscription's throughput is bounded near
// WEBHOOK_MAX_IN_FLIGHT_PER_SUBSCRIPTION / (claimLinger + recordEvery +
// request + write), ~1,400/s for 64 slots and a 10 ms request — raise the
// cap for a single subscription that needs more.
const claimLinger = 20 * time.Millisecond

// fewFreeLinger: see claimLinger. A draining backlog's claims are not lean
// (each takes what a quarter of the slots freed), so it keeps the 5 ms its
// claims had before.
const fewFreeLinger = 5 * time.Millisecond

// contendedRetry is the first wait of a loop whose subscriptions another
// replica's claim was serving (doubling up to 16×, see claimLoop).
const contendedRetry = 5 * time.Millisecond

// recordEvery is the longest spacing between two batches of one recorder
// (see recordLoop; the spacing follows what batches take to write).
const recordEvery = 10 * time.Millisecond

// reserve takes up to n of the free claim slots (capacity minus claims out)
// for one claim, so claim loops running at once never hand out more than
// capacity together.
func (d *Deliverer) reserve(n int) int {
	for {
		out := d.inFlight.Load()
		take := min(int64(n), int64(d.capacity())-out)
		if take <= 0 {
			d.starved.Store(true)
			return 0
		}
		if d.inFlight.CompareAndSwap(out, out+take) {
			return int(take)
		}
	}
}

// reserveBytes takes a share of the payload bytes left of ClaimBytes for
// one claim: 1/ClaimLoops of what is left, so loops claiming at once never
// hold more than ClaimBytes together, plus at most one payload each (a
// claim returns its first row whatever its size). 0 means the budget is
// spent: the loop claims nothing until outcomes give bytes back (they poke).
func (d *Deliverer) reserveBytes() int64 {
	for {
		out := d.bytesOut.Load()
		left := int64(d.cfg.ClaimBytes) - out
		if left <= 0 {
			d.starved.Store(true)
			return 0
		}
		take := max(1, left/int64(d.cfg.ClaimLoops))
		if d.bytesOut.CompareAndSwap(out, out+take) {
			return take
		}
	}
}

// claimLoop claims for its share of the subscriptions (loop of ClaimLoops)
// whenever a notification, a written outcome, a reclaim or the poll tick
// says there may be work. Several loops claim at once, each for different
// subscriptions, so the claim statement's latency no longer bounds the rate
// of the whole deliverer; the per-subscription cap stays exact because a
// subscription is claimed for by one claim at a time (see store.ClaimShare).
// A loop takes at most twice its even share of the free slots per claim, and
// no more than its subscriptions can take, so one loop cannot starve the
// others.
func (d *Deliverer) claimLoop(ctx context.Context, jobs chan<- store.Claim, loop int) {
	ticker := time.NewTicker(d.cfg.PollInterval)
	defer ticker.Stop()
	wake := d.wakes[loop]
	share := max(1, 2*d.capacity()/d.cfg.ClaimLoops)
	// A claim statement has a fixed cost (the stream scan, the locks, the
	// commit) whatever it returns, so under load claiming for every written
	// outcome batch made many claims of a few rows each: 3,476 claims of
	// 8.6 rows for 30,000 deliveries. Unless a quarter of the slots are free
	// (a light load: claim at once, latency first) or nothing is out (idle),
	// a loop claims at most every claimLinger.
	//
	// A claim that found little (fewer than minClaim rows) also makes the
	// next one wait: with several replicas the per-subscription cap, not
	// this process's slots, is what binds, so slots stayed free and every
	// written outcome set off a claim of the one or two rows freed by it —
	// 25,000 claims of ~1 row for 30,000 deliveries with 3 replicas, slower
	// together than one alone. While claims are out this costs a delivery
	// at most claimLinger of latency; with none out, nothing.
	//
	// How long a loop lingers follows what its claims cost (see
	// claimGap): a fixed 20 ms made every lightly loaded delivery wait up
	// to 20 ms for the next claim, on a machine whose claims take 1–2 ms
	// and which has the CPU for more of them.
	minClaim := max(1, d.capacity()/4)
	var last time.Time
	var cost pace
	// served: how many subscriptions the loop's last claim served (0: none
	// or no claim yet); see reserve below.
	served := 0
	failures, contendedEmpty := 0, 0
	lean := false
	for {
		if gap := claimGap(int(d.inFlight.Load()), d.capacity(), minClaim, lean, cost); gap > 0 {
			if wait := gap - time.Since(last); wait > 0 && !service.Sleep(ctx, wait) {
				return
			}
		}
		last = time.Now()
		full, soon := false, false
		var rateWait time.Duration
		if d.capacity()-int(d.inFlight.Load()) <= 0 {
			d.starved.Store(true) // whoever gives slots back wakes the loops
		} else {
			// Slots are reserved for at most what the loop's subscriptions
			// can take (their cap each), as many as its last claim served
			// (the claim is sent in one round trip with the statements that
			// find them). Reserved for twice the loop's even share, two
			// loops' claims held every free slot while they ran and
			// returned 8 rows each, and the other loops, starved, claimed
			// nothing until poked (3 subscriptions at 1,000 events/s each:
			// ~2,000 deliveries/s). Before its first claim, or after one
			// that served none (all contended), a loop does not know, and
			// reserves its share: what the claim does not take is given
			// back as soon as it returns.
			var want int
			var budget int64
			reserve := func() (int, int) {
				n := share
				if served > 0 {
					n = min(share, served*d.cfg.MaxInFlightPerSubscription)
				}
				if want = d.reserve(n); want == 0 {
					return 0, 0
				}
				if budget = d.reserveBytes(); budget == 0 {
					d.inFlight.Add(-int64(want))
					want = 0
				}
				return want, int(budget)
			}
			qctx, cancel := context.WithTimeout(ctx, queryTimeout)
			began := time.Now()
			res, err := d.store.ClaimShare(qctx, store.ClaimParams{
				ClaimedBy: d.cfg.ID, MaxInFlight: d.cfg.MaxInFlightPerSubscription, Lease: d.cfg.Lease,
				Loops: d.cfg.ClaimLoops, Loop: loop, Reserve: reserve,
			})
			claims, contended := res.Claims, res.Contended
			if err == nil && want > 0 {
				served = res.Subscriptions
			}
			// A rate-limited subscription out of tokens: nothing will poke
			// this loop when its next token is due, so it sets a timer
			// rather than waiting for the poll tick (or polling).
			rateWait = res.RateWait
			cancel()
			if want > 0 {
				took := time.Since(began)
				// Progress: a claim that served subscriptions (or found
				// another replica serving them), whatever it returned. A
				// loop whose share holds none claims "successfully" forever.
				if err == nil && (res.Subscriptions > 0 || res.Contended > 0) {
					d.stats.progress.Add(1)
				}
				d.stats.claims.Add(1)
				d.stats.claimed.Add(int64(len(claims)))
				d.stats.claimNanos.Add(int64(took))
				if err == nil {
					cost.observe(took)
				}
			}
			var got int64
			for _, c := range claims {
				got += int64(c.PayloadBytes)
			}
			d.bytesOut.Add(got - budget) // what the claim took, not what it might have
			if unused := want - len(claims); unused > 0 {
				// Slots another loop may have found taken while this one
				// held them: without the poke it would wait for the tick.
				d.inFlight.Add(-int64(unused))
				if d.starved.Swap(false) {
					d.poke()
				}
			}
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				failures++
				d.log.ErrorContext(ctx, "claim failed; retrying", "err", err, "consecutive_failures", failures)
			default:
				failures = 0
				for _, c := range claims {
					jobs <- c // never blocks: at most capacity claims are out
				}
				full = want > 0 && len(claims) == want
				lean = len(claims) < minClaim
				// Another replica's claim is serving some of these
				// subscriptions right now: look again soon rather than at
				// the next tick, backing off while it stays so (5, 10, 20,
				// 40, 80 ms) — that replica is claiming for them, and
				// retrying every 5 ms only split their freed slots into
				// ever smaller claims.
				if soon = contended > 0 && len(claims) == 0; soon {
					contendedEmpty++
				} else {
					contendedEmpty = 0
				}
			}
		}
		if full {
			continue // there may be more; workers are busy now, so free will be 0 or small
		}
		var again, due <-chan time.Time
		if soon {
			again = time.After(contendedRetry << min(contendedEmpty-1, 4))
		}
		if rateWait > 0 {
			due = time.After(rateWait)
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-again:
		case <-due:
		case <-ticker.C:
		}
	}
}

// reclaim runs reclaim_stalled: a claim whose worker died would otherwise
// hold its stream forever.
func (d *Deliverer) reclaim(ctx context.Context) error {
	pending, dead, err := d.store.ReclaimStalled(ctx, 1000, d.cfg.maxAttempts())
	if err != nil {
		return err
	}
	if pending+dead > 0 {
		d.log.WarnContext(ctx, "reclaimed deliveries whose lease expired (attempt kept)", "to_pending", pending, "dead", dead)
		d.poke()
	}
	return nil
}

// historyBatch bounds the outbox rows one history batch looks at (one
// transaction, a few milliseconds), so a long history never holds a
// transaction open or a connection for long.
const historyBatch = 500

// copyHistory copies the history of subscriptions created with --since, a
// bounded batch per transaction, at most 200 batches a round so shutdown is
// never kept waiting.
func (d *Deliverer) copyHistory(ctx context.Context) error {
	for range 200 {
		b, ok, err := d.store.CopyHistory(ctx, historyBatch)
		if err != nil || !ok {
			return err
		}
		if b.Done {
			d.log.InfoContext(ctx, "subscription history copied; its deliveries start", "subscription_id", b.SubscriptionID)
			d.poke()
		}
	}
	return nil
}

// prune applies WEBHOOK_RETENTION in batches of 1,000, so no statement holds
// many row locks or runs long, and at most 100 batches a round, so a large
// first cleanup is spread out; then it deletes idle streams the same way.
func (d *Deliverer) prune(ctx context.Context) error {
	p := service.Prune{Batch: 1000, MaxBatches: 100, Timeout: queryTimeout}
	total, err := service.PruneInBatches(ctx, p, func(ctx context.Context, limit int) (int64, error) {
		n, err := d.store.PruneDelivered(ctx, d.cfg.Retention, limit)
		return int64(n), err
	})
	if total > 0 {
		d.log.InfoContext(ctx, "deleted delivered deliveries past retention", "deleted", total, "retention", d.cfg.Retention)
	}
	if err != nil {
		return err
	}
	streams, err := service.PruneInBatches(ctx, p, func(ctx context.Context, limit int) (int64, error) {
		n, err := d.store.PruneIdleStreams(ctx, limit)
		return int64(n), err
	})
	if streams > 0 {
		d.log.DebugContext(ctx, "deleted idle delivery streams", "deleted", streams)
	}
	return err
}

// process sends one claimed delivery. A success or a retry goes to the
// recorder, which writes it with others (it reports true: the claim stays out
// until then); a death or a release is written here.
func (d *Deliverer) process(ctx, reqCtx context.Context, c store.Claim, results outcomeQueues) bool {
	logCtx := tracing.ContextWithRemoteParent(context.WithoutCancel(ctx), c.Traceparent, c.Tracestate)
	bctx, cancel := context.WithTimeout(logCtx, queryTimeout)
	defer cancel()

	if ctx.Err() != nil {
		// Claimed, but shutdown began before a worker took it: not sent, so
		// not charged.
		d.release(bctx, d.claimLog(&c), &c)
		return false
	}
	res := d.sendLending(reqCtx, &c)
	if !res.success() && res.status == 0 && reqCtx.Err() != nil {
		// Cancelled by shutdown after the grace period: the endpoint did not
		// fail, the deploy interrupted it.
		d.release(bctx, d.claimLog(&c), &c)
		return false
	}
	out := store.Outcome{
		StartedAt: res.started, Duration: res.duration, StatusCode: res.status, Error: res.describe(),
		ResponseBody: truncateUTF8(res.body, maxResponseStored), TraceID: res.traceID,
	}
	if res.success() {
		d.cfg.Metrics.Attempt(res.status, res.duration, store.StatusDelivered)
		results.delivered <- recorded{res: store.Result{Claim: &c, Kind: store.Delivered, Outcome: out}, ctx: logCtx, status: res.status}
		return true
	}
	log := d.claimLog(&c)
	gone := res.status == http.StatusGone
	if gone || c.Attempts >= d.cfg.maxAttempts() {
		d.cfg.Metrics.Attempt(res.status, res.duration, store.StatusDead)
		r, err := d.store.Dead(bctx, &c, d.cfg.ID, out, d.cfg.DisableAfter, gone)
		switch {
		case err != nil:
			log.ErrorContext(bctx, "recording a dead delivery failed", "err", err, "error", out.Error)
		case !r.Current:
			log.WarnContext(bctx, "failed after the claim was reclaimed; outcome logged only", "error", out.Error)
		default:
			log.ErrorContext(bctx, "delivery dead; the rows behind it in its stream proceed", "error", out.Error, "status", res.status,
				"consecutive_dead", r.ConsecutiveFailures)
			d.deadSpan(bctx, &c, out.Error)
			if r.DisabledNow {
				d.cfg.Metrics.SubscriptionDisabled()
				log.ErrorContext(bctx, "subscription disabled", "reason", r.DisabledReason)
			}
		}
		return false
	}
	d.cfg.Metrics.Attempt(res.status, res.duration, "retry")
	scheduled := d.cfg.RetrySchedule[c.Attempts-1]
	delay := retryDelay(scheduled, jitter(scheduled), res.retryAfter, res.hasRA)
	results.retries <- recorded{res: store.Result{Claim: &c, Kind: store.Retry, Outcome: out, RetryIn: delay}, ctx: logCtx, status: res.status}
	return true
}

// slowRequest is how long a request runs before it lends its claim slot
// back (sendLending).
const slowRequest = 250 * time.Millisecond

// sendLending sends c; while the request runs longer than slowRequest its
// claim slot is lent back to the claim loops. Without it an endpoint taking
// 5 s per answer held its subscription's whole cap of slots out of the
// deliverer's capacity for the whole time, and the other subscriptions —
// whose claims are bounded by that capacity — lost as much throughput (42%
// with 8 of 64 slots held on a busy machine). The subscription itself gains
// nothing from it: its cap counts its deliveries in flight in the database,
// not these slots. What bounds the deliverer is then the workers: a lent
// slot's request still runs on one, so at most Workers slots are lent, and
// the jobs queue has room for them.
func (d *Deliverer) sendLending(ctx context.Context, c *store.Claim) result {
	var lent atomic.Bool
	t := time.AfterFunc(slowRequest, func() {
		if lent.CompareAndSwap(false, true) {
			d.inFlight.Add(-1)
			d.poke()
		}
	})
	res := send(ctx, d.client, c, d.cfg.Timeout, time.Now())
	t.Stop()
	if !lent.CompareAndSwap(false, true) {
		// It was lent: take the slot back, so that writing the outcome
		// gives back exactly one.
		d.inFlight.Add(1)
	}
	return res
}

// successRecorders write successes side by side: one recorder wrote a
// batch of 22–30 outcomes every 6–9 ms under bench pipeline's load, busy
// nearly all the time, and a delivery counts against its subscription's
// cap until its outcome is written. Their batches never touch the same
// delivery, and take subscription rows in id order and stream rows with
// SKIP LOCKED, so they do not wait on each other.
const successRecorders = 2

// maxRecordBatch bounds one outcome transaction.
const maxRecordBatch = 512

// recordLoop writes successes and retries in batches: whatever has arrived
// while the previous batch was being written and the rest of recordEvery
// since it began, up to maxRecordBatch. Under light load a batch is one
// outcome, written at once; under heavy load one WAL flush and three
// statements serve many deliveries. It returns when in is closed and
// everything in it is written.
func (d *Deliverer) recordLoop(in <-chan recorded) {
	batch := make([]recorded, 0, maxRecordBatch)
	var last time.Time
	var cost pace
	for first := range in {
		// At most one batch per recordEvery: the cost of a batch is mostly
		// per statement (three of them, and a commit), and with a batch
		// written as soon as the last one was, ~190 batches a second of ~16
		// rows each wrote bench pipeline's 3,000 successes a second.
		// Waiting for the rest of the interval batches ~21; an outcome that
		// arrives after a quiet interval is written at once. The spacing
		// follows what batches have lately taken to write (cost.gap): on a
		// machine with CPU to spare a batch takes a millisecond, and the
		// full wait held the stream's next delivery (its stream is in
		// flight until the outcome is written) for nothing.
		if wait := cost.gap(recordEvery) - time.Since(last); wait > 0 {
			time.Sleep(wait)
		}
		last = time.Now()
		batch = append(batch[:0], first)
	fill:
		for len(batch) < maxRecordBatch {
			select {
			case r, ok := <-in:
				if !ok {
					break fill
				}
				batch = append(batch, r)
			default:
				break fill
			}
		}
		d.record(batch)
		cost.observe(time.Since(last))
		var bytes int64
		for _, r := range batch {
			bytes += int64(r.res.Claim.PayloadBytes)
		}
		d.done(len(batch), bytes)
	}
}

// done gives back the slots and bytes of n claims whose outcome is written
// (or that were released), and wakes the claim loops.
func (d *Deliverer) done(n int, bytes int64) {
	d.inFlight.Add(-int64(n))
	d.bytesOut.Add(-bytes)
	d.poke()
}

// record writes one batch. A batch that cannot be written is not lost
// work: its deliveries stay 'delivering' until their lease runs out, and
// reclaim sends them again (same webhook-id, attempt kept).
func (d *Deliverer) record(batch []recorded) {
	rs := make([]store.Result, len(batch))
	async := !d.cfg.SyncSuccessCommit
	for i, r := range batch {
		rs[i] = r.res
		async = async && r.res.Kind == store.Delivered
	}
	var current []bool
	began := time.Now()
	defer func() {
		d.stats.progress.Add(1)
		d.stats.records.Add(1)
		d.stats.recorded.Add(int64(len(batch)))
		d.stats.recordNanos.Add(int64(time.Since(began)))
	}()
	err := service.Retry(context.Background(), service.Wait{Name: "record delivery outcomes", Timeout: queryTimeout,
		AttemptTimeout: queryTimeout, Logger: d.log}, func(ctx context.Context) error {
		var err error
		current, err = d.store.Record(ctx, d.cfg.ID, rs, store.RecordOptions{Async: async})
		return err
	})
	debug := d.log.Enabled(context.Background(), slog.LevelDebug)
	for i, r := range batch {
		out := r.res.Outcome
		if r.res.Kind == store.Delivered && err == nil && current[i] && !debug {
			continue // the common case logs nothing: no logger built
		}
		log := d.claimLog(r.res.Claim)
		switch {
		case err != nil && r.res.Kind == store.Delivered:
			log.ErrorContext(r.ctx, "delivered, but recording it failed; the lease will return it and it will be sent again", "err", err)
		case err != nil:
			log.ErrorContext(r.ctx, "recording a failed attempt failed", "err", err, "error", out.Error)
		case !current[i] && r.res.Kind == store.Delivered:
			log.WarnContext(r.ctx, "delivered after the claim was reclaimed (lease expired); it may be sent twice", "status", r.status)
		case !current[i]:
			log.WarnContext(r.ctx, "failed after the claim was reclaimed; outcome logged only", "error", out.Error)
		case r.res.Kind == store.Delivered:
			log.DebugContext(r.ctx, "delivered", "status", r.status, "duration", out.Duration)
		default:
			log.WarnContext(r.ctx, "attempt failed; will retry", "error", out.Error, "status", r.status,
				"retry_in", r.res.RetryIn.Round(time.Millisecond))
		}
	}
}

func tracerProvider(tp trace.TracerProvider) trace.TracerProvider {
	if tp == nil {
		return otel.GetTracerProvider()
	}
	return tp
}

// deadSpan records a dead delivery in its trace: a short span with a
// delivery.dead event, so the trace in Jaeger shows where the event stopped.
func (d *Deliverer) deadSpan(ctx context.Context, c *store.Claim, reason string) {
	_, span := d.tracer.Start(ctx, "webhook dead", trace.WithAttributes(
		attribute.String("messaging.message.id", c.EventID),
		attribute.String("webhook.subscription_id", c.SubscriptionID),
		attribute.Int64("webhook.delivery_id", c.ID),
		attribute.Int("webhook.attempt", c.Attempts)))
	span.AddEvent("delivery.dead", trace.WithAttributes(attribute.String("reason", reason)))
	span.SetStatus(codes.Error, reason)
	span.End()
}

// claimLog is the logger of one delivery's lines. It is built only for a
// line that is written: built for every delivery, its five attributes and
// the URL's redaction were ~2% of the bridge's CPU in bench pipeline, for a
// success line that is Debug and off by default.
func (d *Deliverer) claimLog(c *store.Claim) *slog.Logger {
	return d.log.With("delivery_id", c.ID, "dedup_id", c.EventID, "subscription_id", c.SubscriptionID,
		"attempt", c.Attempts, "url", redactURL(c.URL))
}

func (d *Deliverer) release(ctx context.Context, log *slog.Logger, c *store.Claim) {
	if err := d.store.Release(ctx, c, d.cfg.ID); err != nil {
		log.ErrorContext(ctx, "release failed; the lease will return it", "err", err)
	}
}

// redactURL keeps scheme, host and path: subscribers put tokens in query
// strings and userinfo, and logs and traces travel further than the
// database. Everything that shows a subscription's URL outside the
// subscriptions table (log lines, span attributes, an attempt's error)
// goes through it.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL)"
	}
	u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment, u.User, u.Opaque = "", false, "", "", nil, ""
	return u.String()
}
