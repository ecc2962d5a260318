package fastlane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

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

	stats counters
}

type counters struct {
	records, delivered, failed, handedOver, duplicates, unparked atomic.Int64
	isolations, cut                                              atomic.Int64
}

// Stats are the lane's figures since it started.
type Stats struct {
	Records    int64 // records read
	Delivered  int64 // deliveries posted with a 2xx answer
	Failed     int64 // attempts that failed (each parked its stream)
	HandedOver int64 // deliveries written to bridge.deliveries
	Duplicates int64 // adjacent repeats of a dedup-id dropped
	Unparked   int64 // streams that came back from the slow lane
	// Isolations: (subscription, partition) pairs handed to the slow lane
	// as a whole (see Config.IsolateAfter, Config.HoldLimit); Cut: requests
	// in flight cut by an isolation, their deliveries handed over.
	Isolations int64
	Cut        int64
}

// Stats returns the lane's figures so far.
func (l *Lane) Stats() Stats {
	return Stats{
		Records: l.stats.records.Load(), Delivered: l.stats.delivered.Load(), Failed: l.stats.failed.Load(),
		HandedOver: l.stats.handedOver.Load(), Duplicates: l.stats.duplicates.Load(), Unparked: l.stats.unparked.Load(),
		Isolations: l.stats.isolations.Load(), Cut: l.stats.cut.Load(),
	}
}

// PartitionGauge is one owned partition as the lane holds it.
type PartitionGauge struct {
	Topic     string
	Partition int32
	// Settled is the offset below which every record is settled (the
	// offset the next commit writes; -1: no record read yet).
	Settled int64
	// HighWatermark is the partition's end offset at the last fetch (-1:
	// unknown), Lag = HighWatermark − Settled: records not yet settled by
	// every subscription, read or not (-1 when either is unknown).
	HighWatermark, Lag int64
	// Held: records in memory (read, not yet committed past), HeldBytes
	// their bytes as counted against MaxBufferedBytes.
	Held      int
	HeldBytes int64
	// Isolated: subscriptions whose deliveries of this partition go
	// through the slow lane for now (see Config.IsolateAfter).
	Isolated int
}

// Gauges is the lane's state now, for the metrics.
type Gauges struct {
	Partitions []PartitionGauge
	// Streams: (subscription, asset) streams held in memory; Parked: those
	// of them whose deliveries go to the slow lane (bridge.deliveries).
	Streams, Parked int
	// Queued: deliveries waiting in the fast lane for their stream's
	// turn or a worker; InFlight: requests being sent.
	Queued, InFlight int
	// HeldBytes: record bytes held in memory (bounded by MaxBufferedBytes).
	HeldBytes int64
}

// Gauges returns the lane's state. It walks the streams held, under the
// lane's lock: call it at a scrape's pace, not per delivery.
func (l *Lane) Gauges() Gauges {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	g := Gauges{Streams: len(l.streams), InFlight: len(l.sending), HeldBytes: l.buffered}
	for _, s := range l.streams {
		if s.parked {
			g.Parked++
		}
		g.Queued += len(s.fast)
		if s.sending && len(s.fast) > 0 {
			g.Queued--
		}
	}
	for _, p := range l.parts {
		if p.revoked {
			continue
		}
		pg := PartitionGauge{Topic: p.tp.topic, Partition: p.tp.partition, Settled: p.next, HighWatermark: p.highWatermark,
			Held: len(p.recs), Lag: -1}
		for _, r := range p.recs {
			pg.HeldBytes += r.bytes
		}
		for _, r := range p.recs {
			if r.pending > 0 {
				pg.Settled = r.rec.Offset
				break
			}
		}
		if pg.Settled < 0 && p.committed >= 0 {
			pg.Settled = p.committed
		}
		if pg.Settled >= 0 && pg.HighWatermark >= 0 {
			pg.Lag = max(pg.HighWatermark-pg.Settled, 0)
		}
		for _, until := range p.isolated {
			if until.After(now) {
				pg.Isolated++
			}
		}
		g.Partitions = append(g.Partitions, pg)
	}
	slices.SortFunc(g.Partitions, func(a, b PartitionGauge) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return g
}

type topicPartition struct {
	topic     string
	partition int32
}

type streamKey struct{ sub, asset string }

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
}

// record is a polled record and how many of its deliveries are not yet
// settled (posted with a 2xx, or written to bridge.deliveries).
type record struct {
	part    *partition
	rec     *kgo.Record
	msg     contract.Message
	pending int
	bytes   int64
	polled  time.Time
	// items are its deliveries: isolation looks at who still holds a
	// partition's oldest record.
	items []*item
}

type item struct {
	rec     *record
	sub     string
	settled bool
}

// stream is one (subscription, asset) stream's state. Either it is in the
// fast lane (fast holds its deliveries, fast[0] in flight while sending), or
// parked (its deliveries go to toPG and from there, by the hand-over
// service, behind its rows in bridge.deliveries).
type stream struct {
	key     streamKey
	fast    []*item
	sending bool
	sentAt  time.Time // when the head in flight was sent
	queued  bool      // in ready or in its subscription's waiting list
	parked  bool
	// handing: a hand-over of this stream is being written; toPG collects
	// what arrives meanwhile.
	handing bool
	inHandQ bool
	toPG    []*item
	// parkAfterHead: the stream's subscription was isolated while its head
	// was in flight; once the head settles, the rest is handed over.
	parkAfterHead bool
	// cancel cuts the head's request in flight (nil: none in flight); cut:
	// an isolation cut it, so the head goes to the slow lane too (see
	// cutRequest).
	cancel context.CancelFunc
	cut    bool
	// lastHand is handGen when its last hand-over finished.
	lastHand uint64
	// park, when set, is the park the next hand-over writes: the marker, and
	// the failed attempt of toPG[0] (nil failure: parked without one, e.g. a
	// rate-limited subscription).
	park *parkInfo
}

type parkInfo struct {
	failure *delivery.AttemptResult
	retryIn time.Duration
}

type subState struct {
	inFlight int
	waiting  []*stream
	// took is the moving average of its requests' durations, over n
	// requests so far: isolation's yardstick (see slowerThanOthers).
	took time.Duration
	n    int64
}

// slowerFactor: a subscription is slower than the others when its requests
// take this many times theirs.
const slowerFactor = 10

// minRequestsToJudge: a subscription's average counts as a yardstick once
// it has timed this many requests.
const minRequestsToJudge = 5

// movingAverage moves avg towards d by 1/weight.
func movingAverage(avg, d time.Duration, weight int64) time.Duration {
	if avg == 0 {
		return d
	}
	return avg + (d-avg)/time.Duration(weight)
}

// slowerThanOthers reports whether d is slowerFactor times the median of
// the other subscriptions' average requests. Isolation compares a
// subscription with the others, so that an endpoint slow for everyone, or
// a machine slow for every request, isolates no one. l.mu held.
func (l *Lane) slowerThanOthers(sub string, d time.Duration) bool {
	var others []time.Duration
	for id, st := range l.subs {
		if id != sub && st.n >= minRequestsToJudge {
			others = append(others, st.took)
		}
	}
	if len(others) == 0 {
		return false
	}
	slices.Sort(others)
	return d >= slowerFactor*others[len(others)/2]
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
	if err := l.refresh(ctx); err != nil {
		l.client.Close()
		return err
	}
	// The attempt log's partition for today must exist before the first
	// flush.
	if err := l.maintainPartitions(ctx); err != nil {
		l.client.Close()
		return err
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
		service.Every(bg, service.Loop{Name: "append the attempt log", Interval: l.cfg.LogInterval, Logger: l.log}, l.flushLog)
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
		service.Every(bg, service.Loop{Name: "sweep park markers", Interval: time.Minute, Timeout: 30 * time.Second,
			Logger: l.log}, func(ctx context.Context) error { _, err := l.store.SweepParks(ctx, 1000); return err })
	})
	l.log.InfoContext(ctx, "fast lane started", "topics", l.cfg.Topics, "workers", l.cfg.Workers)

	l.poll(ctx)

	// Shutdown: nothing new starts; requests in flight get the grace.
	l.mu.Lock()
	l.stopping = true
	l.work.Broadcast()
	l.mu.Unlock()
	grace := time.AfterFunc(l.cfg.ShutdownGrace, cancelReqs)
	workers.Wait()
	grace.Stop()
	// A hand-over being written finishes (or, PostgreSQL unreachable, is
	// abandoned unsettled after 30s: its records are read again).
	abandon := time.AfterFunc(30*time.Second, stopBG)
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

// poll reads records until ctx ends.
func (l *Lane) poll(ctx context.Context) {
	for {
		// The memory bound: no poll while the records held pass it.
		l.mu.Lock()
		for l.buffered > l.cfg.MaxBufferedBytes && ctx.Err() == nil {
			stop := context.AfterFunc(ctx, func() { l.mu.Lock(); l.idle.Broadcast(); l.mu.Unlock() })
			l.waitIdle()
			stop()
		}
		l.mu.Unlock()
		fetches := l.client.PollRecords(ctx, 1000)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			l.client.AllowRebalance()
			return
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			l.log.WarnContext(ctx, "fetch failed", "topic", topic, "partition", partition, "err", err)
		})
		recs := fetches.Records()
		decoded, ok := l.decode(ctx, recs)
		if !ok {
			l.client.AllowRebalance()
			return
		}
		var bad []*kgo.Record
		l.mu.Lock()
		fetches.EachPartition(func(f kgo.FetchTopicPartition) {
			if p := l.parts[topicPartition{f.Topic, f.Partition}]; p != nil && f.Err == nil {
				p.highWatermark = f.HighWatermark
			}
		})
		for i, r := range recs {
			if !l.take(r, decoded[i]) {
				bad = append(bad, r)
			}
		}
		l.mu.Unlock()
		if len(bad) > 0 {
			l.deadLetter(ctx, bad)
		}
		l.client.AllowRebalance()
	}
}

// decodedRecord is a record read by contract.DecodeWith: err is nil or a
// *contract.DecodeError (the record is dead-lettered).
type decodedRecord struct {
	msg contract.Message
	err error
}

// decode reads recs outside the lane's lock. A schema registry that cannot
// answer holds the poll (the partitions' offsets stay where they are and
// /readyz reports the stall) instead of dead-lettering records that are
// fine; ok is false when ctx ended meanwhile.
func (l *Lane) decode(ctx context.Context, recs []*kgo.Record) (out []decodedRecord, ok bool) {
	out = make([]decodedRecord, len(recs))
	for i, r := range recs {
		err := service.Retry(ctx, service.Wait{Name: "decode with the schema registry", Logger: l.log, LogEvery: 10 * time.Second},
			func(ctx context.Context) error {
				m, err := contract.DecodeWith(ctx, r, l.cfg.Values)
				var de *contract.DecodeError
				if err == nil || errors.As(err, &de) {
					out[i] = decodedRecord{m, err}
					return nil
				}
				return err
			})
		if err != nil {
			return nil, false
		}
	}
	return out, true
}

// take routes one record (l.mu held). It reports false for a record that
// cannot be read: the caller dead-letters it, then settles it.
func (l *Lane) take(r *kgo.Record, d decodedRecord) bool {
	p := l.parts[topicPartition{r.Topic, r.Partition}]
	if p == nil || p.revoked {
		return true // not ours (any more): its new owner reads it
	}
	if n := len(p.recs); n > 0 && r.Offset <= p.recs[n-1].rec.Offset {
		return true // already held
	}
	p.next = r.Offset + 1
	msg, err := d.msg, d.err
	rec := &record{part: p, rec: r, msg: msg, bytes: int64(len(r.Value) + len(r.Key) + 200), polled: time.Now()}
	p.recs = append(p.recs, rec)
	l.buffered += rec.bytes
	l.stats.records.Add(1)
	var de *contract.DecodeError
	if errors.As(err, &de) {
		rec.pending = 1 // settled once dead-lettered
		return false
	}
	if msg.DedupID == p.lastDedup {
		l.stats.duplicates.Add(1)
		return true
	}
	p.lastDedup = msg.DedupID
	asset := assetKey(&msg)
	for i := range l.routes {
		rt := &l.routes[i]
		if !rt.filter.Matches(r.Topic, msg.EventType) {
			continue
		}
		rec.pending++
		s := l.stream(streamKey{rt.ID, asset})
		it := &item{rec: rec, sub: rt.ID}
		rec.items = append(rec.items, it)
		switch {
		case s.parked:
			l.toSlowLane(s, it)
		case !s.sending && len(s.fast) == 0 && p.isolated[rt.ID].After(rec.polled):
			// The subscription is isolated on this partition: a stream of
			// it that is idle here starts in the slow lane.
			s.parked = true
			s.park = &parkInfo{}
			l.toSlowLane(s, it)
		case rt.RateLimit > 0:
			// A rate limit holds across every replica only where one place
			// counts: the slow lane's token bucket in bridge.subscriptions.
			s.parked = true
			s.park = &parkInfo{}
			l.toSlowLane(s, it)
		default:
			s.fast = append(s.fast, it)
			l.schedule(s)
		}
	}
	return true
}

// assetKey is the stream's asset key: coalesce(asset_id, ”).
func assetKey(m *contract.Message) string {
	if m.AssetID == nil {
		return ""
	}
	return *m.AssetID
}

// waitIdle waits on l.idle, counted in l.idleWaiters. l.mu held.
func (l *Lane) waitIdle() {
	l.idleWaiters++
	l.idle.Wait()
	l.idleWaiters--
}

// stream returns the stream of key, creating it (parked if a marker says
// so). l.mu held.
func (l *Lane) stream(key streamKey) *stream {
	s := l.streams[key]
	if s == nil {
		s = &stream{key: key, parked: l.parkedKeys[key]}
		l.streams[key] = s
	}
	return s
}

// toSlowLane queues it for the hand-over service. l.mu held.
func (l *Lane) toSlowLane(s *stream, it *item) {
	s.toPG = append(s.toPG, it)
	if !s.handing && !s.inHandQ {
		s.inHandQ = true
		l.handQ = append(l.handQ, s)
		l.hand.Signal()
	}
}

// schedule makes s's head ready to send if nothing of s is in flight and its
// subscription is under its cap. l.mu held.
func (l *Lane) schedule(s *stream) {
	if s.sending || s.queued || s.parked || len(s.fast) == 0 {
		return
	}
	sub := l.subs[s.key.sub]
	if sub == nil {
		sub = &subState{}
		l.subs[s.key.sub] = sub
	}
	s.queued = true
	if sub.inFlight >= l.subCap() {
		sub.waiting = append(sub.waiting, s)
		return
	}
	sub.inFlight++
	l.ready = append(l.ready, s)
	l.work.Signal()
}

// settle counts one delivery of rec as settled. l.mu held.
func (l *Lane) settle(rec *record) {
	rec.pending--
}

// settleItem counts it as settled. l.mu held.
func (l *Lane) settleItem(it *item) {
	if !it.settled {
		it.settled = true
		it.rec.pending--
	}
}

// forget drops s if it holds nothing. l.mu held.
func (l *Lane) forget(s *stream) {
	if !s.parked && !s.sending && !s.queued && !s.handing && len(s.fast) == 0 && len(s.toPG) == 0 {
		delete(l.streams, s.key)
	}
}

// worker sends stream heads until the lane stops.
func (l *Lane) worker(reqCtx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		for len(l.ready) == 0 && !l.stopping {
			l.work.Wait()
		}
		if l.stopping {
			return
		}
		s := l.ready[0]
		l.ready[0] = nil
		l.ready = l.ready[1:]
		s.queued = false
		if len(s.fast) == 0 || s.parked || s.fast[0].rec.part.revoked {
			l.release(s)
			l.forget(s)
			continue
		}
		s.sending = true
		s.sentAt = time.Now()
		l.sending[s] = struct{}{}
		it := s.fast[0]
		rt := l.route(it.sub)
		ctx, cancel := context.WithCancel(reqCtx)
		s.cancel = cancel
		l.mu.Unlock()
		var res delivery.AttemptResult
		if rt == nil {
			res = delivery.AttemptResult{Outcome: store.Outcome{StartedAt: time.Now(), Error: "subscription deleted"}}
		} else {
			res = delivery.Attempt(ctx, l.http, claimOf(it, rt), l.cfg.Timeout)
		}
		cancel()
		l.mu.Lock()
		s.cancel = nil
		s.sending = false
		delete(l.sending, s)
		l.release(s)
		l.done(s, it, rt, res)
		if l.idleWaiters > 0 {
			l.idle.Broadcast()
		}
	}
}

// release gives s's subscription slot back and starts a stream waiting for
// it. l.mu held.
func (l *Lane) release(s *stream) {
	sub := l.subs[s.key.sub]
	sub.inFlight--
	l.admit(sub, l.subCap())
}

// admit starts sub's streams waiting for a slot while it has fewer than
// limit requests in flight. l.mu held.
func (l *Lane) admit(sub *subState, limit int) {
	for len(sub.waiting) > 0 && sub.inFlight < limit {
		w := sub.waiting[0]
		sub.waiting[0] = nil
		sub.waiting = sub.waiting[1:]
		sub.inFlight++
		l.ready = append(l.ready, w)
		l.work.Signal()
	}
}

// done applies the outcome of s's head. l.mu held.
func (l *Lane) done(s *stream, it *item, rt *route, res delivery.AttemptResult) {
	if l.cutDone(s, it, rt, res) {
		return
	}
	if res.Interrupted || rt == nil {
		// Shutdown or a revoke cut the request (or the subscription is gone):
		// nothing settles; the record's next owner sends it again with the
		// same webhook-id. A deleted subscription's deliveries settle.
		if rt == nil {
			s.fast = s.fast[1:]
			l.settleItem(it)
		}
		l.schedule(s)
		l.forget(s)
		return
	}
	l.logAttempt(it, res)
	if sub := l.subs[it.sub]; sub != nil {
		sub.took = movingAverage(sub.took, res.Outcome.Duration, 16)
		sub.n++
	}
	if it.rec.part.revoked {
		// The partition moved while the request ran: its new owner sends
		// the record again (same webhook-id) unless this success was
		// committed before the revoke finished.
		if res.Success {
			l.settleItem(it)
		}
		s.fast = s.fast[1:]
		l.schedule(s)
		l.forget(s)
		return
	}
	if res.Success {
		l.cfg.Metrics.Attempt(res.Outcome.StatusCode, res.Outcome.Duration, store.StatusDelivered)
		l.stats.delivered.Add(1)
		l.forgive[it.sub] = true
		s.fast[0] = nil
		s.fast = s.fast[1:]
		l.settleItem(it)
		if s.parkAfterHead {
			s.parkAfterHead = false
			l.parkRest(s)
		}
		l.schedule(s)
		l.forget(s)
		return
	}
	l.stats.failed.Add(1)
	l.cfg.Metrics.Attempt(res.Outcome.StatusCode, res.Outcome.Duration, "retry")
	// The head failed: the stream is parked, this delivery and every later
	// one of the stream go to the slow lane, which retries on the schedule.
	s.parkAfterHead = false
	r := res
	s.parked = true
	s.park = &parkInfo{failure: &r, retryIn: delivery.RetryIn(l.cfg.RetrySchedule, 1, res)}
	rest := s.fast
	s.fast = nil
	for _, x := range rest {
		l.toSlowLane(s, x)
	}
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("stream parked: its head failed", "subscription_id", it.sub, "asset", s.key.asset,
			"dedup_id", it.rec.msg.DedupID, "error", res.Outcome.Error, "queued", len(rest))
	}
}

// parkRest hands every delivery s holds in the fast lane (none in flight)
// to the slow lane, without an attempt. l.mu held.
func (l *Lane) parkRest(s *stream) {
	if len(s.fast) == 0 || s.sending {
		return
	}
	l.parkHeld(s)
}

// parkHeld parks s and hands every delivery it holds in the fast lane to
// the slow lane, in order, without an attempt. l.mu held.
func (l *Lane) parkHeld(s *stream) {
	s.parked = true
	s.park = &parkInfo{}
	rest := s.fast
	s.fast = nil
	for _, x := range rest {
		l.toSlowLane(s, x)
	}
}

// isolateSlow looks at the requests in flight: a subscription whose request
// for a record has been in flight for IsolateAfter, and slowerFactor times
// the other subscriptions' average request (a slow endpoint, not a slow
// machine), is handed to the slow lane as a whole on every partition this
// member owns for IsolationPeriod, its requests in flight cut, so it stops
// holding the partitions' offsets and memory and the member's workers for
// the other subscriptions. Slow is a request in flight that long — not a
// delivery waiting for a worker, which is this member's capacity and the
// same for every subscription. It looks only at the streams sending (at
// most Workers), never at every record held.
func (l *Lane) isolateSlow(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	type partSub struct {
		p   *partition
		sub string
	}
	var slow map[partSub]isolation
	for s := range l.sending {
		if len(s.fast) == 0 || now.Sub(s.sentAt) < l.cfg.IsolateAfter || !l.slowerThanOthers(s.key.sub, now.Sub(s.sentAt)) {
			continue
		}
		p := s.fast[0].rec.part
		if p.revoked || !p.isolated[s.key.sub].Before(now) {
			continue
		}
		if slow == nil {
			slow = map[partSub]isolation{}
		}
		// The endpoint is slow, not the partition: the subscription is
		// isolated on every partition this member owns, at once, rather
		// than one partition each time a request of it there has run
		// IsolateAfter (its next requests, on the next partition, held
		// workers as long again).
		for _, q := range l.parts {
			if !q.revoked && q.isolated[s.key.sub].Before(now) {
				slow[partSub{q, s.key.sub}] = isolation{cut: true,
					why: "a request in flight longer than IsolateAfter and slowerFactor × the other subscriptions' average"}
			}
		}
	}
	// A subscription that holds a partition's offset: the oldest record
	// not yet settled has waited HoldLimit, another subscription has
	// settled it, and this one's delivery of it still waits in the fast
	// lane while the subscription is at its in-flight cap with streams
	// waiting for a slot (its backlog grows faster than its endpoint
	// answers). The others' offset and memory would wait for it: it is
	// isolated too. A subscription under its cap that is merely behind
	// is this member's capacity (workers, CPU), the same for every
	// subscription, and is never isolated: moving it to PostgreSQL would
	// only make the member slower.
	for _, p := range l.parts {
		if p.revoked {
			continue
		}
		head := l.oldestUnsettled(p)
		if head == nil || now.Sub(head.polled) < l.cfg.HoldLimit {
			continue
		}
		var holders []string
		for _, it := range head.items {
			if it.settled || !p.isolated[it.sub].Before(now) {
				continue
			}
			sub := l.subs[it.sub]
			if sub == nil || sub.inFlight < l.subCap() || len(sub.waiting) == 0 || !l.slowerThanOthers(it.sub, sub.took) {
				continue
			}
			if s := l.streams[streamKey{it.sub, assetKey(&it.rec.msg)}]; s != nil && !s.parked && slices.Contains(s.fast, it) {
				holders = append(holders, it.sub)
			}
		}
		if len(holders) == 0 || head.pending == len(head.items) {
			continue
		}
		for _, sub := range holders {
			if slow == nil {
				slow = map[partSub]isolation{}
			}
			if _, ok := slow[partSub{p, sub}]; !ok {
				slow[partSub{p, sub}] = isolation{why: "at its in-flight cap with streams waiting, holding the partition's oldest record past HoldLimit"}
			}
		}
	}
	for ps, iso := range slow {
		l.isolate(ctx, ps.p, ps.sub, now, iso)
	}
	return nil
}

// oldestUnsettled is p's first record with a delivery not yet settled
// (nil: none). l.mu held.
func (l *Lane) oldestUnsettled(p *partition) *record {
	for _, r := range p.recs {
		if r.pending > 0 {
			return r
		}
	}
	return nil
}

// isolate hands sub's streams on p to the slow lane: at once for those with
// nothing in flight; for the others, with iso.cut (a slow endpoint) their
// requests in flight are cut and the heads handed over first (cutRequest),
// so no worker waits for an isolated endpoint, and without it (a
// subscription holding the offset, whose requests are not slow) after the
// head. l.mu held.
func (l *Lane) isolate(ctx context.Context, p *partition, sub string, now time.Time, iso isolation) {
	p.isolated[sub] = now.Add(l.cfg.IsolationPeriod)
	streams := 0
	for key, s := range l.streams {
		if key.sub != sub || s.parked || !slices.ContainsFunc(s.fast, func(it *item) bool { return it.rec.part == p }) {
			continue
		}
		streams++
		switch {
		case s.sending && iso.cut:
			l.cutRequest(s)
		case s.sending:
			s.parkAfterHead = true
		default:
			l.parkRest(s)
		}
	}
	l.stats.isolations.Add(1)
	l.log.WarnContext(ctx, "subscription isolated: it held records of its partition unsettled too long; its deliveries there go through the slow lane for a while",
		"subscription_id", sub, "topic", p.tp.topic, "partition", p.tp.partition, "streams", streams, "why", iso.why,
		"for", l.cfg.IsolationPeriod)
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

// claimOf is the slow lane's claim shape of an in-memory delivery, so both
// lanes send through the same code (signature, SSRF, trace, envelope).
func claimOf(it *item, rt *route) *store.Claim {
	m := &it.rec.msg
	return &store.Claim{
		SubscriptionID: it.sub, EventID: m.DedupID, EventType: m.EventType, Topic: it.rec.rec.Topic,
		AssetID: m.AssetID, AssetSeq: m.AssetSeq, Payload: m.Payload, EventCreatedAt: m.CreatedAt,
		Traceparent: m.Traceparent, Tracestate: m.Tracestate, Attempts: 1,
		URL: rt.URL, Secrets: rt.Secrets, SecretsErr: rt.SecretsErr, PayloadBytes: len(m.Payload),
	}
}

// logAttempt queues the attempt for the attempt log. l.mu held.
func (l *Lane) logAttempt(it *item, res delivery.AttemptResult) {
	m := &it.rec.msg
	l.attempts = append(l.attempts, store.FastAttempt{
		SubscriptionID: it.sub, EventID: m.DedupID, EventType: m.EventType, Topic: it.rec.rec.Topic,
		Partition: it.rec.rec.Partition, Offset: it.rec.rec.Offset, AssetID: m.AssetID, Attempt: 1, Outcome: res.Outcome,
	})
}

// flushLog appends the queued attempts in one statement.
func (l *Lane) flushLog(ctx context.Context) error {
	l.mu.Lock()
	// Two buffers take turns: the one being written to PostgreSQL and the
	// one filling, so the log's slice is not grown again every flush.
	as := l.attempts
	l.attempts, l.spareAttempts = l.spareAttempts[:0], nil
	var forgive []string
	for id := range l.forgive {
		forgive = append(forgive, id)
	}
	clear(l.forgive)
	l.mu.Unlock()
	if len(as) == 0 && len(forgive) == 0 {
		return nil
	}
	// A flush under way finishes even when the lane is stopping (its
	// context is cancelled then): cut short, its lines would be lost, and
	// the last flush at shutdown only takes what is still queued.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err := l.store.LogFastAttempts(wctx, as, forgive)
	clear(as) // no strings kept alive by the spare buffer
	l.mu.Lock()
	if l.spareAttempts == nil {
		l.spareAttempts = as[:0]
	}
	l.mu.Unlock()
	if err != nil {
		// The deliveries are done either way; the log misses these lines.
		return fmt.Errorf("%d attempts not logged: %w", len(as), err)
	}
	return nil
}

// taken is one stream's share of a hand-over: the deliveries taken from
// its toPG, their rows, and the marker when this hand-over parks it.
type taken struct {
	s      *stream
	key    store.Stream
	items  []*item
	rows   []store.Parked
	marker *store.Marker
	// done: how many of items (from the front) are settled — written to
	// bridge.deliveries, or dead-lettered because PostgreSQL refuses them.
	done int
	// back: the marker was gone (the slow lane emptied the stream); the
	// items from done on go back to the fast lane.
	back bool
}

// handOverService writes parked streams' deliveries to bridge.deliveries,
// all the streams waiting in one transaction.
func (l *Lane) handOverService(ctx context.Context) {
	var last time.Time
	for {
		// One hand-over per HandOverInterval at most, of everything
		// queued meanwhile (see Config.HandOverInterval).
		if wait := l.cfg.HandOverInterval - time.Since(last); wait > 0 {
			service.Sleep(ctx, wait)
		}
		l.mu.Lock()
		for len(l.handQ) == 0 && ctx.Err() == nil {
			stop := context.AfterFunc(ctx, func() { l.mu.Lock(); l.hand.Broadcast(); l.mu.Unlock() })
			l.hand.Wait()
			stop()
		}
		if ctx.Err() != nil {
			l.mu.Unlock()
			return
		}
		batch := l.handQ
		l.handQ = nil
		var ts []*taken
		for _, s := range batch {
			s.inHandQ = false
			var items []*item
			for _, it := range s.toPG {
				if !it.rec.part.revoked {
					items = append(items, it)
				}
			}
			s.toPG = nil
			if len(items) == 0 {
				l.forget(s)
				continue
			}
			s.handing = true
			t := &taken{s: s, key: store.Stream{SubscriptionID: s.key.sub, AssetKey: s.key.asset}, items: items}
			for i, it := range items {
				p := store.Parked{SubscriptionID: it.sub, Event: eventOf(it)}
				if i == 0 && s.park != nil && s.park.failure != nil {
					f := s.park.failure.Outcome
					p.Attempts, p.RetryIn, p.StatusCode, p.Error = 1, s.park.retryIn, f.StatusCode, f.Error
				}
				t.rows = append(t.rows, p)
			}
			if s.park != nil {
				r := items[0].rec
				t.marker = &store.Marker{Stream: t.key, Topic: r.rec.Topic, Partition: r.rec.Partition, Offset: r.rec.Offset}
				s.park = nil
			}
			ts = append(ts, t)
		}
		if len(ts) == 0 {
			l.mu.Unlock()
			continue
		}
		l.handing++
		l.mu.Unlock()
		last = time.Now()

		err := service.Retry(ctx, service.Wait{Name: "hand deliveries to the slow lane", Logger: l.log, LogEvery: 10 * time.Second},
			func(ctx context.Context) error {
				err := l.handOver(ctx, ts)
				if consumer.IsRecordFault(err) {
					// PostgreSQL refuses the data of some record (a \u0000
					// in its JSON, …): retrying the batch can never
					// succeed. Each stream is handed over alone, and in a
					// stream that is refused each delivery alone, so only
					// the offenders are dead-lettered.
					l.log.WarnContext(ctx, "PostgreSQL refused a hand-over; handing over stream by stream to isolate the record", "err", err)
					err = l.handOverIsolated(ctx, ts)
				}
				return err
			})

		l.mu.Lock()
		l.handGen++
		for _, t := range ts {
			s := t.s
			s.handing = false
			s.lastHand = l.handGen
			if err != nil {
				// Shutdown while PostgreSQL was unreachable: nothing settles,
				// the records are read again by the partition's next owner.
				l.forget(s)
				continue
			}
			for _, it := range t.items[:t.done] {
				l.settleItem(it)
			}
			l.stats.handedOver.Add(int64(t.done))
			if t.back {
				// The slow lane emptied the stream before these arrived:
				// they and whatever came meanwhile go out from here, in
				// order.
				s.parked = false
				delete(l.parkedKeys, s.key)
				s.fast = append(slices.Clone(t.items[t.done:]), s.toPG...)
				s.toPG = nil
				l.stats.unparked.Add(1)
				l.schedule(s)
			} else if len(s.toPG) > 0 && !s.inHandQ {
				s.inHandQ = true
				l.handQ = append(l.handQ, s)
			}
			l.forget(s)
		}
		l.handing--
		l.idle.Broadcast()
		l.mu.Unlock()
	}
}

// handOver writes every taken stream in one transaction.
func (l *Lane) handOver(ctx context.Context, ts []*taken) error {
	var markers []store.Marker
	var appends []store.Stream
	var rows []store.Parked
	for _, t := range ts {
		if t.marker != nil {
			markers = append(markers, *t.marker)
		} else {
			appends = append(appends, t.key)
		}
		rows = append(rows, t.rows...)
	}
	unparked, err := l.store.HandOver(ctx, markers, appends, rows)
	if err != nil {
		return err
	}
	back := make(map[store.Stream]bool, len(unparked))
	for _, u := range unparked {
		back[u] = true
	}
	for _, t := range ts {
		t.back = back[t.key]
		if !t.back {
			t.done = len(t.items)
		}
	}
	return nil
}

// handOverIsolated hands over each stream alone, and a stream PostgreSQL
// refuses one delivery at a time, dead-lettering the deliveries it refuses
// (a refused head's stream goes on with the next one, as after a death).
func (l *Lane) handOverIsolated(ctx context.Context, ts []*taken) error {
	for _, t := range ts {
		if t.done == len(t.items) || t.back {
			continue
		}
		err := l.handOver(ctx, []*taken{t})
		if !consumer.IsRecordFault(err) {
			if err != nil {
				return err
			}
			continue
		}
		for t.done < len(t.items) && !t.back {
			one := &taken{s: t.s, key: t.key, items: t.items[t.done : t.done+1], rows: t.rows[t.done : t.done+1], marker: t.marker}
			err := l.handOver(ctx, []*taken{one})
			switch {
			case consumer.IsRecordFault(err):
				if err := l.produceDeadLetters(ctx, []*kgo.Record{one.items[0].rec.rec},
					[]string{"PostgreSQL refused the record: " + err.Error()}); err != nil {
					return err
				}
				if t.marker != nil {
					// The stream stays parked without the refused row.
					if err := l.handOver(ctx, []*taken{{s: t.s, key: t.key, marker: t.marker}}); err != nil {
						return err
					}
				}
			case err != nil:
				return err
			case one.back:
				t.back = true
				continue
			}
			t.marker = nil // written: the rest are appends
			t.done++
		}
	}
	return nil
}

func eventOf(it *item) store.Event {
	m := &it.rec.msg
	return store.Event{
		ID: m.DedupID, Type: m.EventType, Topic: it.rec.rec.Topic, AssetID: m.AssetID, AssetSeq: m.AssetSeq,
		Payload: string(m.Payload), CreatedAt: m.CreatedAt, Traceparent: m.Traceparent, Tracestate: m.Tracestate,
	}
}

// commit commits, for every partition still owned, the offset of its lowest
// record not yet settled by every subscription.
func (l *Lane) commit(ctx context.Context) error {
	offsets := l.settledOffsets(func(p *partition) bool { return !p.revoked })
	if len(offsets) == 0 {
		return nil
	}
	var cerr error
	l.client.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) { cerr = err })
	return cerr
}

// settledOffsets advances the partitions chosen past their settled prefix
// and returns the offsets to commit. It takes l.mu.
func (l *Lane) settledOffsets(which func(*partition) bool) map[string]map[int32]kgo.EpochOffset {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]map[int32]kgo.EpochOffset{}
	for _, p := range l.parts {
		if !which(p) {
			continue
		}
		var last *record
		n := 0
		for n < len(p.recs) && p.recs[n].pending == 0 {
			last = p.recs[n]
			l.buffered -= last.bytes
			n++
		}
		if last == nil {
			continue
		}
		clear(p.recs[:n])
		p.recs = p.recs[n:]
		next := last.rec.Offset + 1
		if next <= p.committed {
			continue
		}
		p.committed = next
		if out[p.tp.topic] == nil {
			out[p.tp.topic] = map[int32]kgo.EpochOffset{}
		}
		out[p.tp.topic][p.tp.partition] = kgo.EpochOffset{Epoch: last.rec.LeaderEpoch, Offset: next}
	}
	if len(out) > 0 {
		l.idle.Broadcast() // memory was given back
	}
	return out
}

// assigned creates the new partitions' state and reads the park markers
// before the first of their records is fetched, and the topics' partition
// count (see subCap).
func (l *Lane) assigned(ctx context.Context, _ *kgo.Client, added map[string][]int32) {
	var keys []store.Stream
	_ = service.Retry(ctx, service.Wait{Name: "read park markers on assignment", Logger: l.log, LogEvery: 10 * time.Second},
		func(ctx context.Context) error {
			var err error
			keys, err = l.store.Parks(ctx)
			return err
		})
	l.mu.Lock()
	for _, k := range keys {
		key := streamKey{k.SubscriptionID, k.AssetKey}
		l.parkedKeys[key] = true
		if s := l.streams[key]; s != nil && !s.parked && !s.sending && len(s.fast) == 0 {
			s.parked = true
		}
	}
	for topic, ps := range added {
		for _, id := range ps {
			tp := topicPartition{topic, id}
			l.parts[tp] = &partition{tp: tp, committed: -1, next: -1, highWatermark: -1, isolated: map[string]time.Time{}}
		}
	}
	l.mu.Unlock()
	l.log.InfoContext(ctx, "partitions assigned", "partitions", added, "parked_streams", len(keys))
	l.countPartitions(ctx)
}

// revoked stops taking work of the partitions, waits (ShutdownGrace at
// most) for their requests and hand-overs in flight, commits what is
// settled and forgets them; the new owner starts from that offset and
// re-sends the rest with the same webhook-ids.
func (l *Lane) revoked(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
	l.drop(ctx, lost, true)
}

// lost: the group already gave the partitions away; nothing is committed.
func (l *Lane) lost(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
	l.drop(ctx, lost, false)
}

func (l *Lane) drop(ctx context.Context, gone map[string][]int32, commit bool) {
	l.mu.Lock()
	var ps []*partition
	for topic, ids := range gone {
		for _, id := range ids {
			if p := l.parts[topicPartition{topic, id}]; p != nil {
				p.revoked = true
				ps = append(ps, p)
			}
		}
	}
	if len(ps) == 0 {
		l.mu.Unlock()
		return
	}
	deadline := time.Now().Add(l.cfg.ShutdownGrace)
	timer := time.AfterFunc(l.cfg.ShutdownGrace, func() { l.mu.Lock(); l.idle.Broadcast(); l.mu.Unlock() })
	defer timer.Stop()
	for (l.handing > 0 || l.sendingFrom(ps)) && time.Now().Before(deadline) {
		l.waitIdle()
	}
	l.mu.Unlock()
	if commit {
		offsets := l.settledOffsets(func(p *partition) bool { return p.revoked })
		if len(offsets) > 0 {
			l.client.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) {
				if err != nil {
					l.log.WarnContext(ctx, "committing revoked partitions failed; their new owner re-sends from the last commit", "err", err)
				}
			})
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range ps {
		for _, r := range p.recs {
			l.buffered -= r.bytes
		}
		p.recs = nil
		delete(l.parts, p.tp)
	}
	// Forget the revoked records' deliveries: queued ones are dropped, and a
	// parked stream's state is left to the markers (read again by whoever
	// owns the partition next).
	for _, s := range l.streams {
		s.fast = slices.DeleteFunc(s.fast, func(it *item) bool { return it.rec.part.revoked && !(s.sending && it == s.fast[0]) })
		s.toPG = slices.DeleteFunc(s.toPG, func(it *item) bool { return it.rec.part.revoked })
		l.schedule(s)
		l.forget(s)
	}
	l.idle.Broadcast()
	l.log.InfoContext(ctx, "partitions revoked", "partitions", gone, "committed", commit)
}

// sendingFrom reports a request in flight for a record of ps. l.mu held.
func (l *Lane) sendingFrom(ps []*partition) bool {
	for _, s := range l.streams {
		if s.sending && len(s.fast) > 0 && slices.Contains(ps, s.fast[0].rec.part) {
			return true
		}
	}
	return false
}

// refresh reads the subscriptions and the park markers.
func (l *Lane) refresh(ctx context.Context) error {
	l.mu.Lock()
	gen := l.handGen
	l.mu.Unlock()
	rs, err := l.store.FastRoutes(ctx)
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
	return nil
}

// maintainPartitions is one round of the AttemptPartitions service.
func (l *Lane) maintainPartitions(ctx context.Context) error { return l.partitions().RunOnce(ctx) }

// partitions is the lane's AttemptPartitions service.
func (l *Lane) partitions() *AttemptPartitions {
	return NewAttemptPartitions(l.store, AttemptPartitionsConfig{Retention: l.cfg.AttemptRetention, Logger: l.log})
}

// deadLetter produces unreadable records to "<topic>.dlq" (as the consumer
// does), retrying until acknowledged, then settles them.
func (l *Lane) deadLetter(ctx context.Context, bad []*kgo.Record) {
	reasons := make([]string, len(bad))
	for i, r := range bad {
		_, err := contract.DecodeWith(ctx, r, l.cfg.Values)
		reasons[i] = err.Error()
	}
	err := service.Retry(ctx, service.Wait{Name: "produce dead letters", Logger: l.log, LogEvery: 10 * time.Second},
		func(ctx context.Context) error { return l.produceDeadLetters(ctx, bad, reasons) })
	if err != nil {
		return // shutdown: not settled, read again
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range bad {
		if p := l.parts[topicPartition{r.Topic, r.Partition}]; p != nil {
			for _, rec := range p.recs {
				if rec.rec == r {
					l.settle(rec)
				}
			}
		}
	}
}

// produceDeadLetters produces recs to "<topic>.dlq" with the consumer's
// headers and waits for the acknowledgements.
func (l *Lane) produceDeadLetters(ctx context.Context, recs []*kgo.Record, reasons []string) error {
	out := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		hs := append(slices.Clone(r.Headers),
			kgo.RecordHeader{Key: contract.HeaderDLQReason, Value: []byte(reasons[i])},
			kgo.RecordHeader{Key: contract.HeaderDLQTopic, Value: []byte(r.Topic)},
			kgo.RecordHeader{Key: contract.HeaderDLQPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
			kgo.RecordHeader{Key: contract.HeaderDLQOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
		)
		out[i] = &kgo.Record{Topic: r.Topic + contract.DeadLetterSuffix, Key: r.Key, Value: r.Value, Headers: hs, Timestamp: r.Timestamp}
		l.log.WarnContext(ctx, "record dead-lettered", "reason", reasons[i], "topic", r.Topic, "partition", r.Partition, "offset", r.Offset)
	}
	return l.client.ProduceSync(ctx, out...).FirstErr()
}
