package fastlane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/consumer"
	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/service"
)

// Lane is the fast lane: one member of a consumer group on the event
// topics that posts each record it owns to the matching subscriptions
// straight from memory, one request in flight per (subscription, asset)
// stream, in partition order. A stream whose head fails is handed to the
// slow lane (bridge.deliveries) with every later event of it, and comes back
// when the slow lane has emptied it. See docs/architecture.md, "The fast
// lane".
type Lane struct {
	cfg    Config
	store  *store.DeliveryStore
	client *kgo.Client
	http   *http.Client
	log    *slog.Logger

	// refreshMu serializes the reads of the routes (refresh, awaitRoutes),
	// so routes and routesAsOf only move forward. It is never taken while
	// l.mu is held.
	refreshMu sync.Mutex
	// routesVersion is bridge.subscriptions_version at the last routes
	// read (refreshMu held).
	routesVersion int64
	// routesAsOf is PostgreSQL's now() (unix ns) of the last routes read or
	// of the last version check that found routesVersion unchanged: the
	// routes held are those of a snapshot taken at or after it. A record
	// whose event began later waits for a check (see awaitRoutes).
	routesAsOf atomic.Int64
	// awaiting counts records polled that wait for that check, for Waiting.
	awaiting atomic.Int64

	mu sync.Mutex
	// work wakes the workers (a stream is ready), hand the hand-over
	// service (a stream has rows for the slow lane) — two conditions, so a
	// signal for one is never taken by the other; idle wakes whoever waits
	// for requests or hand-overs to end (revoke, shutdown, the memory
	// bound).
	work, hand, idle *sync.Cond
	routes           []route
	parts            map[topicPartition]*partition
	streams          map[streamKey]*stream
	// parkedKeys is the last read of bridge.delivery_parks: a stream seen
	// for the first time starts parked if its key is here.
	parkedKeys map[streamKey]bool
	subs       map[string]*subState
	ready      []*stream // streams whose head may be sent now
	// sending are the streams whose head is in flight: what isolateSlow
	// looks at, rather than every record held.
	sending map[*stream]struct{}
	// idleWaiters counts the goroutines waiting on idle, so a finished
	// request wakes them only when one waits.
	idleWaiters int
	handQ       []*stream // streams with rows waiting to be handed over
	handing     int       // hand-overs being written
	// handGen counts finished hand-overs; a stream remembers the count at
	// its last one (stream.lastHand), so a read of the markers that began
	// before it cannot unpark it (see refresh).
	handGen  uint64
	buffered int64 // record bytes held (polled, not yet committed past)
	attempts []store.FastAttempt
	// spareAttempts is attempts' other buffer (see flushLog).
	spareAttempts []store.FastAttempt
	forgive       map[string]bool
	stopping      bool // workers take nothing new
	// totalParts: partitions of the topics consumed, this member's and the
	// others' (0: not known yet); see subCap.
	totalParts int
	// slowKeys are the streams the slow lane may have a request of in
	// flight (parked: by a marker read, or by this member since), and
	// slowStreams counts them per subscription: the slots the fast lane
	// leaves to the slow lane (see capOf).
	slowKeys    map[streamKey]bool
	slowStreams map[string]int
	// failing: each subscription's run of failed heads (see headFailed).
	failing map[string]*failRun
	// endpoints: what the lane knows of each subscription's endpoint being
	// slow or isolated (see slowendpoint.go).
	endpoints map[string]*endpointState

	stats counters
	// lim is the live limit on requests in flight; active counts the
	// requests in flight it applies to (see limiter.go).
	lim    *limiter
	active int

	// logFlushed: when flushLog last took the queued attempts.
	logFlushed time.Time
}

type counters struct {
	records, delivered, failed, handedOver, duplicates, unparked, deadLettered atomic.Int64
	isolations, cut                                                            atomic.Int64
	limit, limitLowest, limitHighest                                           atomic.Int64
	// What the member's own services did: polls that returned records,
	// attempt-log flushes and their rows, offset commits.
	polls, logFlushes, logRows, commits atomic.Int64
	// routeChecks: version checks run because records were newer than the
	// routes; routeReads: full reads of the routes they led to (a changed
	// version).
	routeChecks, routeReads atomic.Int64
}

type topicPartition struct {
	topic     string
	partition int32
}

// route is a subscription as the lane routes and posts to it.
type route struct {
	store.FastRoute
	filter contract.Filter
}

// partition is one owned partition: its records in offset order from the
// first one not yet committed past.
type partition struct {
	tp      topicPartition
	recs    []*record
	revoked bool
	// lastDedup is the dedup-id of the last record read: a record that
	// repeats it (the relay produced it twice in a row) is dropped.
	lastDedup string
	committed int64 // -1: nothing committed by this member yet
	// next is the offset after the last record read (-1: none read yet);
	// highWatermark the partition's end offset at the last fetch (-1:
	// unknown). They give the partition's lag (see Gauges).
	next, highWatermark int64
	// isolated: subscriptions handed to the slow lane as a whole on this
	// partition, until the time given (see isolate).
	isolated map[string]time.Time
	// waiting: each subscription's deliveries of this partition not yet
	// settled (see overBounds).
	waiting map[string]*backlog
}

type subState struct {
	inFlight int
	waiting  []*stream
	// took is the moving average of its requests' durations, over n
	// requests so far: isolation's yardstick (see slowerThanOthers).
	took time.Duration
	n    int64
}

// New builds a lane on pool; it connects when Run starts.
func New(pool *pgxpool.Pool, kafkaOpts []kgo.Opt, cfg Config) (*Lane, error) {
	if pool == nil {
		return nil, errors.New("fast lane: nil database pool")
	}
	cfg = cfg.withDefaults()
	topicOpts, err := consumer.TopicOptions(cfg.Topics)
	if err != nil {
		return nil, err
	}
	l := &Lane{
		cfg:        cfg,
		store:      store.NewDeliveryStore(pool).WithKeys(cfg.Keys),
		http:       delivery.NewHTTPClient(cfg.AllowedCIDRs, cfg.TracerProvider, cfg.Workers),
		log:        cfg.Logger.With("component", "fastlane", "group", cfg.Group),
		parts:      map[topicPartition]*partition{},
		streams:    map[streamKey]*stream{},
		parkedKeys: map[streamKey]bool{},
		subs:       map[string]*subState{},
		forgive:    map[string]bool{},
		sending:    map[*stream]struct{}{},
	}
	l.work = sync.NewCond(&l.mu)
	l.hand = sync.NewCond(&l.mu)
	l.idle = sync.NewCond(&l.mu)
	l.slowKeys, l.slowStreams = map[streamKey]bool{}, map[string]int{}
	l.lim = newLimiter(cfg, time.Now())
	l.stats.limit.Store(int64(l.lim.limit))
	l.stats.limitLowest.Store(int64(l.lim.limit))
	l.stats.limitHighest.Store(int64(l.lim.limit))
	opts := slices.Clone(kafkaOpts)
	opts = append(opts, topicOpts...)
	opts = append(opts,
		kgo.ConsumerGroup(cfg.Group),
		// Offsets are committed by the lane, only up to the lowest record
		// every subscription has settled.
		kgo.DisableAutoCommit(),
		// Cooperative: a rebalance moves only the partitions that change
		// owner; the others keep delivering.
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		// Records handed out by a poll are in the lane's memory before a
		// rebalance may run, so a revoke sees every one of them.
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeStartOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(cfg.FetchMaxWait),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.HeartbeatInterval(min(max(cfg.SessionTimeout/10, 100*time.Millisecond), 3*time.Second)),
		kgo.RebalanceTimeout(cfg.RebalanceTimeout),
		kgo.OnPartitionsAssigned(l.assigned),
		kgo.OnPartitionsRevoked(l.revoked),
		kgo.OnPartitionsLost(l.lost),
		// Unreadable records are dead-lettered to "<topic>.dlq" by this
		// client, as the consumer does.
		kgo.AllowAutoTopicCreation(),
	)
	opts = append(opts, cfg.groupOpts...)
	l.client, err = kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client for the fast lane: %w", err)
	}
	return l, nil
}

// Run delivers until ctx is cancelled, then stops reading, gives requests in
// flight ShutdownGrace, commits what is settled and leaves the group.
func (l *Lane) Run(ctx context.Context) error {
	defer l.http.CloseIdleConnections()
	// The park markers are written from here on, by every writer of
	// bridge.deliveries; the streams with open rows are parked before the
	// first read of the markers.
	// A stop during these start steps (SIGTERM right after start) is a
	// clean stop: nothing was read yet, so nothing is left unsettled.
	if n, err := l.store.EnableParks(ctx); err != nil {
		l.client.Close()
		return stoppedOr(ctx, err)
	} else if n > 0 {
		l.log.InfoContext(ctx, "park markers turned on", "parked_streams", n)
	}
	if err := l.refresh(ctx); err != nil {
		l.client.Close()
		return stoppedOr(ctx, err)
	}
	// The attempt log's partition for today must exist before the first
	// flush.
	if err := l.maintainPartitions(ctx); err != nil {
		l.client.Close()
		return stoppedOr(ctx, err)
	}
	reqCtx, cancelReqs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReqs()
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var workers, services sync.WaitGroup
	for range l.cfg.Workers {
		workers.Go(func() { l.worker(reqCtx) })
	}
	services.Go(func() { l.handOverService(bg) })
	services.Go(func() {
		service.Every(bg, service.Loop{Name: "commit settled offsets", Interval: l.cfg.CommitInterval, Logger: l.log}, l.commit)
	})
	services.Go(func() {
		service.Every(bg, service.Loop{Name: "append the attempt log", Interval: l.cfg.LogInterval, Logger: l.log}, l.flushLogDue)
	})
	services.Go(func() {
		service.Every(bg, service.Loop{Name: "read subscriptions and park markers", Interval: l.cfg.RefreshInterval,
			Timeout: 30 * time.Second, Logger: l.log}, l.refresh)
	})
	services.Go(func() { l.partitions().Run(bg) })
	services.Go(func() {
		service.Every(bg, service.Loop{Name: "isolate slow subscriptions", Interval: l.cfg.CommitInterval, Logger: l.log}, l.isolateSlow)
	})
	services.Go(func() {
		service.Every(bg, service.Loop{Name: "uncount overdue requests", Interval: limitWindow / 2, Logger: l.log},
			func(context.Context) error { l.tickLimit(); return nil })
	})
	services.Go(func() {
		service.Every(bg, service.Loop{Name: "sweep park markers", Interval: time.Minute, Timeout: 30 * time.Second,
			Logger: l.log}, func(ctx context.Context) error { _, err := l.store.SweepParks(ctx, 1000); return err })
	})
	l.log.InfoContext(ctx, "fast lane started", "topics", l.cfg.Topics, "workers", l.cfg.Workers, "in_flight_limit", l.cfg.InFlightLimit)

	l.poll(ctx)

	// Shutdown: nothing new starts; requests in flight get the grace.
	l.mu.Lock()
	l.stopping = true
	l.work.Broadcast()
	l.mu.Unlock()
	deadline := time.Now().Add(l.cfg.ShutdownGrace)
	grace := time.AfterFunc(l.cfg.ShutdownGrace, cancelReqs)
	workers.Wait()
	grace.Stop()
	// A hand-over being written finishes within the same grace (at least
	// handOverStopGrace, which one insert on a healthy database needs);
	// one retrying against a failing PostgreSQL is then abandoned
	// unsettled, and its records are read again by the partition's next
	// owner. The orchestrator's SIGKILL comes WEBHOOK_SHUTDOWN_GRACE after
	// SIGTERM plus its margin, not after a hand-over's retries.
	abandon := time.AfterFunc(max(time.Until(deadline), handOverStopGrace), stopBG)
	l.mu.Lock()
	for l.handing > 0 {
		l.waitIdle()
	}
	l.mu.Unlock()
	abandon.Stop()
	stopBG()
	services.Wait()
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := l.flushLog(fctx); err != nil {
		l.log.WarnContext(fctx, "appending the last attempts failed", "err", err)
	}
	if err := l.commit(fctx); err != nil {
		l.log.WarnContext(fctx, "committing settled offsets at shutdown failed; their records will be read again", "err", err)
	}
	l.client.CloseAllowingRebalance()
	l.log.InfoContext(fctx, "fast lane stopped", "stats", l.Stats())
	return nil
}

// route returns the subscription id's route (nil: deleted). l.mu held.
func (l *Lane) route(id string) *route {
	for i := range l.routes {
		if l.routes[i].ID == id {
			return &l.routes[i]
		}
	}
	return nil
}

// refresh reads the subscriptions and the park markers.
func (l *Lane) refresh(ctx context.Context) error {
	l.refreshMu.Lock()
	defer l.refreshMu.Unlock()
	return l.refreshLocked(ctx)
}

// refreshLocked is refresh with l.refreshMu held.
func (l *Lane) refreshLocked(ctx context.Context) error {
	l.mu.Lock()
	gen := l.handGen
	l.mu.Unlock()
	rs, version, err := l.store.FastRoutesAt(ctx)
	if err != nil {
		return err
	}
	keys, err := l.store.Parks(ctx)
	if err != nil {
		return err
	}
	routes := make([]route, len(rs))
	for i, r := range rs {
		routes[i] = route{FastRoute: r, filter: contract.Filter{Enabled: r.Enabled, EventTypes: r.EventTypes, Topic: r.Topic}}
	}
	parked := make(map[streamKey]bool, len(keys))
	for _, k := range keys {
		parked[streamKey{k.SubscriptionID, k.AssetKey}] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.routes = routes
	l.routesVersion = version.Version
	l.advanceRoutesAsOf(version.AsOf)
	l.parkedKeys = parked
	for key, s := range l.streams {
		switch {
		case parked[key] && !s.parked && !s.sending && !s.queued && len(s.fast) == 0:
			// Parked by another writer (revive, recover, history): what
			// comes next goes behind its rows.
			s.parked = true
		case !parked[key] && s.parked && !s.handing && len(s.toPG) == 0 && s.park == nil && s.lastHand <= gen:
			// The slow lane emptied it (its last hand-over committed before
			// this read began, so the read would have seen a marker still
			// there): forget the stream; it starts in the fast lane next
			// time.
			s.parked = false
			l.forget(s)
		}
	}
	l.countSlowStreams(parked)
	return nil
}

// advanceRoutesAsOf moves routesAsOf to t unless it is already later (a
// clock stepped back must not make records wait again). l.refreshMu held.
func (l *Lane) advanceRoutesAsOf(t time.Time) {
	if n := t.UnixNano(); n > l.routesAsOf.Load() {
		l.routesAsOf.Store(n)
	}
}

// awaitRoutes returns once the routes held may fan out an event that began
// at newest: routes read in a snapshot taken at or after newest (see
// docs/architecture.md, "The fast lane"). An older event needs nothing.
// Else it runs one version check, `SELECT version, now()` on a one-row
// table: an unchanged version makes the routes held those of the check's
// snapshot; a changed one reads the routes first. Checks are coalesced: one
// runs at a time, and a caller that finds, after waiting for the one in
// flight, that it covers newest runs none.
//
// One check is enough even when newest is later than its now() (a
// created-at from a clock ahead of PostgreSQL's): the check began after the
// record was read, so after its event committed, and its snapshot holds
// every subscription committed before the event's transaction began.
//
// PostgreSQL unreachable: it retries until ctx ends, and the records wait
// (counted by Waiting, so /readyz's fast_lane_progress reports the stall).
func (l *Lane) awaitRoutes(ctx context.Context, newest time.Time) error {
	if newest.UnixNano() <= l.routesAsOf.Load() {
		return nil
	}
	// An attempt is bounded as the refresh is, so a connection that hangs
	// is given up and retried rather than holding the poll for good.
	return service.Retry(ctx, service.Wait{Name: "check the subscriptions' version", Logger: l.log, LogEvery: 10 * time.Second,
		AttemptTimeout: 30 * time.Second},
		func(ctx context.Context) error {
			l.refreshMu.Lock()
			defer l.refreshMu.Unlock()
			if newest.UnixNano() <= l.routesAsOf.Load() {
				return nil // the check or read in flight covered it
			}
			v, err := l.store.CheckRoutes(ctx)
			if err != nil {
				return err
			}
			l.stats.routeChecks.Add(1)
			if v.Version == l.routesVersion {
				l.advanceRoutesAsOf(v.AsOf)
				return nil
			}
			l.stats.routeReads.Add(1)
			return l.refreshLocked(ctx)
		})
}

// handOverStopGrace is the least time a hand-over being written at shutdown
// gets, whatever is left of WEBHOOK_SHUTDOWN_GRACE.
const handOverStopGrace = time.Second

// stoppedOr is nil when ctx has ended (the member was stopped), else err.
func stoppedOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
