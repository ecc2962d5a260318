package delivery

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/delivery/store"
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

	wake     chan struct{}
	inFlight atomic.Int64
	running  atomic.Bool
}

// NewDeliverer returns a Deliverer on pool; zero fields of cfg take their
// defaults. `bridge deliver` and `bridge run` both start one.
func NewDeliverer(pool *pgxpool.Pool, cfg Config) (*Deliverer, error) {
	cfg = cfg.withDefaults()
	if cfg.Lease <= cfg.Timeout {
		return nil, fmt.Errorf("webhook lease (%s) must be longer than the request timeout (%s): a claim must not expire while its request can still be running", cfg.Lease, cfg.Timeout)
	}
	d := &Deliverer{
		pool:   pool,
		cfg:    cfg,
		store:  store.NewDeliveryStore(pool),
		client: NewHTTPClient(cfg.AllowedCIDRs, cfg.TracerProvider),
		log:    cfg.Logger.With("component", "deliverer", "deliverer_id", cfg.ID),
		tracer: tracerProvider(cfg.TracerProvider).Tracer("github.com/outboxbridge/bridge/internal/delivery"),
		wake:   make(chan struct{}, 1),
	}
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

// ID is what this deliverer writes in claimed_by.
func (d *Deliverer) ID() string { return d.cfg.ID }

func defaultID() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

func (d *Deliverer) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
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

	jobs := make(chan store.Claim, d.capacity())
	var workers, loops sync.WaitGroup
	for range d.cfg.Workers {
		workers.Go(func() {
			for c := range jobs {
				d.process(ctx, reqCtx, c)
				d.inFlight.Add(-1)
				d.poke()
			}
		})
	}
	loops.Go(func() { d.listen(ctx) })
	loops.Go(func() { d.reclaimLoop(ctx) })
	loops.Go(func() { d.pruneLoop(ctx) })

	d.log.InfoContext(ctx, "delivering", "workers", d.cfg.Workers, "max_in_flight_per_subscription", d.cfg.MaxInFlightPerSubscription,
		"poll_interval", d.cfg.PollInterval, "lease", d.cfg.Lease, "max_attempts", d.cfg.maxAttempts())
	d.claimLoop(ctx, jobs)

	// Shutdown.
	d.log.InfoContext(ctx, "stopping: no new claims; waiting for requests in flight", "in_flight", d.inFlight.Load(), "grace", d.cfg.ShutdownGrace)
	grace := time.AfterFunc(d.cfg.ShutdownGrace, cancelReqs)
	close(jobs)
	workers.Wait()
	grace.Stop()
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

// capacity is how many claims may be out at once: one per worker plus half
// as many again queued. The claim statement costs about the same for 5 rows
// as for 30, and the claim loop is serial, so claiming only for idle workers
// made it the bottleneck (a claim returned the few workers that freed up
// during the previous one). The queue is small and bounded, so memory stays
// bounded by the worker count, whatever the backlog; queued claims hold only
// rows that are their stream's next anyway.
func (d *Deliverer) capacity() int { return d.cfg.Workers + (d.cfg.Workers+1)/2 }

// claimLoop claims up to capacity whenever a notification, a finished
// delivery, a reclaim or the poll tick says there may be work.
func (d *Deliverer) claimLoop(ctx context.Context, jobs chan<- store.Claim) {
	ticker := time.NewTicker(d.cfg.PollInterval)
	defer ticker.Stop()
	failures := 0
	for {
		free := d.capacity() - int(d.inFlight.Load())
		full := false
		if free > 0 {
			qctx, cancel := context.WithTimeout(ctx, queryTimeout)
			claims, err := d.store.Claim(qctx, store.ClaimParams{
				ClaimedBy: d.cfg.ID, Limit: free, MaxInFlight: d.cfg.MaxInFlightPerSubscription, Lease: d.cfg.Lease,
			})
			cancel()
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				failures++
				d.log.ErrorContext(ctx, "claim failed; retrying", "err", err, "consecutive_failures", failures)
			default:
				failures = 0
				d.inFlight.Add(int64(len(claims)))
				for _, c := range claims {
					jobs <- c // never blocks: at most capacity claims are out
				}
				full = len(claims) == free
			}
		}
		if full {
			continue // there may be more; workers are busy now, so free will be 0 or small
		}
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-ticker.C:
		}
	}
}

// listen wakes the claim loop on every NOTIFY bridge_deliveries, so a new
// delivery waits for a round trip rather than a poll. A lost connection costs
// latency only: the poll tick still claims.
func (d *Deliverer) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := d.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		d.log.WarnContext(ctx, "LISTEN connection lost; polling until it is back", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(d.cfg.PollInterval, time.Second)):
		}
	}
}

func (d *Deliverer) listenOnce(ctx context.Context) error {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire LISTEN connection: %w", err)
	}
	// The connection is never given back to the pool still listening: it is
	// closed, and the pool replaces it.
	defer func() {
		_ = conn.Conn().Close(context.Background())
		conn.Release()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return fmt.Errorf("listen %s: %w", notifyChannel, err)
	}
	d.poke() // rows may have arrived while nobody listened
	for {
		if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		d.poke()
	}
}

// reclaimLoop runs reclaim_stalled every ReclaimInterval: a claim whose
// worker died would otherwise hold its stream forever.
func (d *Deliverer) reclaimLoop(ctx context.Context) {
	ticker := time.NewTicker(d.cfg.ReclaimInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		qctx, cancel := context.WithTimeout(ctx, queryTimeout)
		pending, dead, err := d.store.ReclaimStalled(qctx, 1000, d.cfg.maxAttempts())
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			d.log.ErrorContext(ctx, "reclaim stalled deliveries failed", "err", err)
		case pending+dead > 0:
			d.log.WarnContext(ctx, "reclaimed deliveries whose lease expired (attempt kept)", "to_pending", pending, "dead", dead)
			d.poke()
		}
	}
}

// pruneLoop applies WEBHOOK_RETENTION every PruneInterval, in batches of
// 1,000 so no statement holds many row locks or runs long, and at most 100
// batches a round so a large first cleanup is spread out.
func (d *Deliverer) pruneLoop(ctx context.Context) {
	ticker := time.NewTicker(d.cfg.PruneInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		total := 0
		for range 100 {
			qctx, cancel := context.WithTimeout(ctx, queryTimeout)
			n, err := d.store.PruneDelivered(qctx, d.cfg.Retention, 1000)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				d.log.ErrorContext(ctx, "retention failed", "err", err)
				break
			}
			total += n
			if n < 1000 {
				break
			}
		}
		if total > 0 {
			d.log.InfoContext(ctx, "deleted delivered deliveries past retention", "deleted", total, "retention", d.cfg.Retention)
		}
	}
}

// process sends one claimed delivery and records the outcome.
func (d *Deliverer) process(ctx, reqCtx context.Context, c store.Claim) {
	logCtx := tracing.ContextWithRemoteParent(context.WithoutCancel(ctx), c.Traceparent, c.Tracestate)
	log := d.log.With("delivery_id", c.ID, "dedup_id", c.EventID, "subscription_id", c.SubscriptionID,
		"attempt", c.Attempts, "url", redactURL(c.URL))
	bctx, cancel := context.WithTimeout(logCtx, queryTimeout)
	defer cancel()

	if ctx.Err() != nil {
		// Claimed, but shutdown began before a worker took it: not sent, so
		// not charged.
		d.release(bctx, log, &c)
		return
	}
	res := send(reqCtx, d.client, &c, d.cfg.Timeout, time.Now())
	if !res.success() && res.status == 0 && reqCtx.Err() != nil {
		// Cancelled by shutdown after the grace period: the endpoint did not
		// fail, the deploy interrupted it.
		d.release(bctx, log, &c)
		return
	}
	out := store.Outcome{
		StartedAt: res.started, Duration: res.duration, StatusCode: res.status, Error: res.describe(),
		ResponseBody: truncateUTF8(res.body, maxResponseStored), TraceID: res.traceID,
	}
	if res.success() {
		d.cfg.Metrics.Attempt(res.status, res.duration, store.StatusDelivered)
		current, err := d.store.Complete(bctx, &c, d.cfg.ID, out)
		switch {
		case err != nil:
			log.ErrorContext(bctx, "delivered, but recording it failed; the lease will return it and it will be sent again", "err", err)
		case !current:
			log.WarnContext(bctx, "delivered after the claim was reclaimed (lease expired); it may be sent twice", "status", res.status)
		default:
			log.DebugContext(bctx, "delivered", "status", res.status, "duration", res.duration)
		}
		return
	}
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
		return
	}
	d.cfg.Metrics.Attempt(res.status, res.duration, "retry")
	scheduled := d.cfg.RetrySchedule[c.Attempts-1]
	delay := retryDelay(scheduled, jitter(scheduled), res.retryAfter, res.hasRA)
	current, err := d.store.Retry(bctx, &c, d.cfg.ID, out, delay)
	switch {
	case err != nil:
		log.ErrorContext(bctx, "recording a failed attempt failed", "err", err, "error", out.Error)
	case !current:
		log.WarnContext(bctx, "failed after the claim was reclaimed; outcome logged only", "error", out.Error)
	default:
		log.WarnContext(bctx, "attempt failed; will retry", "error", out.Error, "status", res.status, "retry_in", delay.Round(time.Millisecond))
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
