package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// notifyChannel is where the deliveries trigger announces new rows.
const notifyChannel = "bridge_deliveries"

// queryTimeout bounds one bookkeeping query, so a stuck statement cannot
// stall a loop forever.
const queryTimeout = 30 * time.Second

// Deliverer claims deliveries and sends them with a pool of workers. Several
// Deliverers (processes or replicas) can run against one database: the claim
// keeps per-(subscription, asset) order across all of them. Its work is done
// by its services (Services), run by Run under one supervisor.
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
	// breakers hold back the due heads of subscriptions whose endpoint
	// fails every stream (see breakers).
	breakers *breakers
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
	d.breakers = newBreakers(cfg.BreakerAfter, cfg.ProbeInterval, d.log)
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
//
// The work is done by the deliverer's services (Services), one per
// background job, run side by side by one supervisor; Run returns once every
// one of them has returned, and only then releases the claims still held.
func (d *Deliverer) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("deliverer is already running")
	}
	defer d.running.Store(false)

	d.log.InfoContext(ctx, "delivering", "workers", d.cfg.Workers, "max_in_flight_per_subscription", d.cfg.MaxInFlightPerSubscription,
		"poll_interval", d.cfg.PollInterval, "lease", d.cfg.Lease, "max_attempts", d.cfg.maxAttempts())
	Supervise(ctx, d.log, d.Services()...)

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

// Services are the deliverer's background jobs, one service each, in the
// order Run starts them: the delivery pipeline (claim loops, workers,
// recorders), the LISTEN on bridge_deliveries, reclaim, retention and the
// subscription history copy. Each has its own configuration, derived from
// the deliverer's Config.
func (d *Deliverer) Services() []Service {
	return []Service{
		&pipeline{d: d},
		NewNotifier(NotifierConfig{Pool: d.pool, Logger: d.log, Wake: d.poke}),
		NewReclaimer(d.store, ReclaimerConfig{Interval: d.cfg.ReclaimInterval, MaxAttempts: d.cfg.maxAttempts(),
			Logger: d.log, Wake: d.poke}),
		NewRetention(d.store, RetentionConfig{Retention: d.cfg.Retention, Interval: d.cfg.PruneInterval, Logger: d.log}),
		NewHistoryCopier(d.store, HistoryCopierConfig{Interval: d.cfg.PollInterval, Logger: d.log, Wake: d.poke, Copy: d.historyCopy()}),
	}
}

// historyCopy is the history copier's step: nil (from the outbox) unless
// the history is read from Kafka.
func (d *Deliverer) historyCopy() func(context.Context) (store.HistoryBatch, bool, error) {
	src := d.cfg.HistoryFromKafka
	if src == nil {
		return nil
	}
	return func(ctx context.Context) (store.HistoryBatch, bool, error) {
		return src.CopyHistory(ctx, d.pool, d.store, d.log)
	}
}

func tracerProvider(tp trace.TracerProvider) trace.TracerProvider {
	if tp == nil {
		return otel.GetTracerProvider()
	}
	return tp
}
