package deliverbench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/bench"
	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/delivery/fastlane"
	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// rowWritesSQL sums the row writes PostgreSQL counted on the bridge's tables.
const rowWritesSQL = `
SELECT coalesce(sum(n_tup_ins), 0)::bigint, coalesce(sum(n_tup_upd), 0)::bigint, coalesce(sum(n_tup_del), 0)::bigint
FROM pg_stat_user_tables WHERE schemaname = 'bridge'`

type rowWrites struct{ ins, upd, del int64 }

// settledRowWrites reads rowWritesSQL until two reads 500 ms apart agree:
// a backend reports its counters at most once a second, and an idle one
// later still, so one read can miss the last writes.
func settledRowWrites(ctx context.Context, pool *pgxpool.Pool) (rowWrites, error) {
	var last rowWrites
	for i := 0; ; i++ {
		var w rowWrites
		if err := pool.QueryRow(ctx, rowWritesSQL).Scan(&w.ins, &w.upd, &w.del); err != nil {
			return w, fmt.Errorf("read pg_stat_user_tables: %w", err)
		}
		if i > 0 && w == last {
			return w, nil
		}
		last = w
		select {
		case <-ctx.Done():
			return w, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// runFast is Run with the fast lane (Options.Kafka): the backlog sits in a
// fresh topic and o.Replicas lane members (each with a slow-lane deliverer
// and a pool of its own, as separate `bridge deliver` processes) drain it.
func runFast(ctx context.Context, pool *pgxpool.Pool, o Options, dc delivery.Config, rc *receiver, res *Result,
	subIDs []string, unhealthy int) (*Result, error) {
	res.Engine = "kafka"
	res.InFlightLimitMode = cmp.Or(o.Kafka.InFlightLimit, fastlane.LimitAdaptive)
	kopts := o.Kafka.KafkaOpts
	parts := o.Kafka.Partitions
	if parts <= 0 {
		parts = 12
	}
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	topic := "bench-deliver-" + uuid.NewString()[:8]
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, parts, 1, nil, topic); err != nil {
		return nil, fmt.Errorf("create topic %s: %w", topic, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(dctx, topic)
	}()
	records := o.Events / o.Subscriptions
	res.Events = records * o.Subscriptions

	// The group forms first, on the empty topic: every member has joined
	// and the partitions are spread before the backlog exists, so the
	// drain measures a steady group delivering, not members joining one
	// after another and partitions moving between them while it runs.
	group := "bench-deliver-" + uuid.NewString()[:8]
	var pools []*pgxpool.Pool
	var lanes []*fastlane.Lane
	var slows []*delivery.Deliverer
	closePools := func() {
		for _, p := range pools {
			p.Close()
		}
		pools = nil
	}
	defer closePools()
	var procs *memberProcs
	if o.Kafka.Member != nil {
		res.MemberProcesses = true
		if procs, err = startMembers(o, memberEnv(o, dc, topic, group, pool.Config().MaxConns), o.Replicas); err != nil {
			return nil, err
		}
		defer procs.stop() //nolint:errcheck // stopped (and its error returned) after the drain
	}
	for r := range o.Replicas {
		if procs != nil {
			break
		}
		p, err := pgxpool.NewWithConfig(ctx, pool.Config().Copy())
		if err != nil {
			return nil, fmt.Errorf("replica pool: %w", err)
		}
		pools = append(pools, p)
		rcfg := dc
		rcfg.ID = fmt.Sprintf("bench-replica-%d", r+1)
		d, err := delivery.NewDeliverer(p, rcfg)
		if err != nil {
			return nil, err
		}
		l, err := fastlane.New(p, kopts, fastlane.Config{
			Group: group, Topics: []string{topic}, Workers: dc.Workers, MaxInFlightPerSubscription: dc.MaxInFlightPerSubscription,
			Timeout: dc.Timeout, RetrySchedule: dc.RetrySchedule, AllowedCIDRs: dc.AllowedCIDRs, Logger: o.Logger, ID: rcfg.ID,
			InFlightLimit: o.Kafka.InFlightLimit,
		})
		if err != nil {
			return nil, err
		}
		slows, lanes = append(slows, d), append(lanes, l)
	}
	runCtx, stopAll := context.WithCancel(ctx)
	errs := make(chan error, 2*len(lanes))
	for i := range lanes {
		go func() { errs <- slows[i].Run(runCtx) }()
		go func() { errs <- lanes[i].Run(runCtx) }()
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		stopAll()
		var all []error
		for range 2 * len(lanes) {
			all = append(all, <-errs)
		}
		return errors.Join(all...)
	}
	defer stop() //nolint:errcheck // stopped (and its error returned) after the drain
	formed := time.Now()
	formedCheck := func() bool { return spread(lanes, int(parts)) }
	var procErr error
	if procs != nil {
		last := time.Time{}
		formedCheck = func() bool {
			if procErr = procs.gone(); procErr != nil {
				return true
			}
			if time.Since(last) < 100*time.Millisecond {
				return false
			}
			last = time.Now()
			ok, _ := groupSpread(ctx, adm, group, topic, o.Replicas, int(parts))
			return ok
		}
	}
	if err := waitUntil(ctx, formedCheck); err != nil || procErr != nil {
		err = cmp.Or(procErr, err)
		return nil, fmt.Errorf("consumer group of %d members did not form: %w", o.Replicas, err)
	}
	res.GroupFormSeconds = time.Since(formed).Seconds()
	o.Logger.InfoContext(ctx, "consumer group formed", "members", o.Replicas, "elapsed_seconds", res.GroupFormSeconds)

	// The backlog is produced in one transaction: the members read
	// committed records only, so none of it is delivered before the commit
	// starts the drain's clock.
	txn, err := kgo.NewClient(append(kopts, kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerBatchMaxBytes(1<<20), kgo.TransactionalID("bench-deliver-"+uuid.NewString()),
		kgo.TransactionTimeout(5*time.Minute))...)
	if err != nil {
		return nil, fmt.Errorf("kafka transactional client: %w", err)
	}
	defer txn.Close()
	if err := txn.BeginTransaction(); err != nil {
		return nil, fmt.Errorf("begin the backlog's transaction: %w", err)
	}
	pad := strings.Repeat("x", 160)
	seqs := make([]int64, o.Assets)
	start := time.Now()
	batch := make([]*kgo.Record, 0, 10000)
	// assetPart: each asset's partition, for the receiver's per-partition
	// counts.
	assetPart := make([]int32, o.Assets)
	flush := func() error {
		if err := txn.ProduceSync(ctx, batch...).FirstErr(); err != nil {
			return fmt.Errorf("produce backlog: %w", err)
		}
		for _, r := range batch {
			if i, err := strconv.Atoi(strings.TrimPrefix(string(r.Key), "asset-")); err == nil && i >= 0 && i < len(assetPart) {
				assetPart[i] = r.Partition
			}
		}
		batch = batch[:0]
		return nil
	}
	// next is record j of the run (backlog first, then live): assets
	// round-robin, asset_seq going up by one per asset.
	next := func(j int, live bool) *kgo.Record {
		a := j % o.Assets
		seqs[a]++
		asset := "asset-" + strconv.Itoa(a)
		p, _ := json.Marshal(payload{T: time.Now().UnixNano(), Live: live, Pad: pad})
		return contract.Encode(contract.Event{DedupID: uuid.NewString(), Topic: topic, AssetID: &asset,
			AssetSeq: seqs[a], EventType: "bench.event", Payload: p, CreatedAt: time.Now()})
	}
	for j := range records {
		batch = append(batch, next(j, false))
		if len(batch) == cap(batch) {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	res.InsertSeconds = time.Since(start).Seconds()
	o.Logger.InfoContext(ctx, "backlog produced, not committed yet", "records", records, "deliveries", res.Events, "elapsed_seconds", res.InsertSeconds)

	// Every backend of the bench's own pool exits and reports its counters
	// (the members have written nothing yet).
	pool.Reset()
	before, err := settledRowWrites(ctx, pool)
	if err != nil {
		return nil, err
	}
	quiet := time.Now()
	for {
		busy0, all0, ok := machineCPU()
		if !ok {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
		busy1, all1, ok := machineCPU()
		if !ok || all1 <= all0 {
			break
		}
		res.MachineBusyBeforeFraction = float64(busy1-busy0) / float64(all1-all0)
		if o.Kafka.QuietBelow <= 0 || res.MachineBusyBeforeFraction < o.Kafka.QuietBelow {
			break
		}
		if time.Since(quiet) >= cmp.Or(o.Kafka.QuietWait, time.Minute) {
			res.QuietTimedOut = true
			break
		}
	}
	res.QuietWaitSeconds = time.Since(quiet).Seconds() - 1
	dbName := pool.Config().ConnConfig.Database
	pgBefore, pgOK := postgresCPU(dbName)
	selfBefore := selfCPU()
	var membersBefore time.Duration
	membersOK := procs != nil
	if procs != nil {
		membersBefore, membersOK = procs.cpu()
	}
	busyBefore, allBefore, machineOK := machineCPU()
	kafkaBefore, kafkaOK := brokerCPU()
	goBefore := readGoRuntime()
	statsBefore := laneStats(lanes)
	prof, err := startProfile(o.Profile)
	if err != nil {
		return nil, err
	}
	defer prof.stop() //nolint:errcheck // stopped (and its error returned) after the drain
	res.BaselineHeapMiB = bench.MiB(bench.HeapInuseNow())
	// Who owns which partitions as the drain starts: the group's view for
	// member processes, the lanes' own for in-process members.
	ownedAtStart := groupAssignment(ctx, adm, group, topic)
	owned := ownedAtStart
	if procs == nil {
		owned = nil
		for _, l := range lanes {
			var ps []int32
			for _, g := range l.Gauges().Partitions {
				if g.Topic == topic {
					ps = append(ps, g.Partition)
				}
			}
			owned = append(owned, ps)
		}
	}
	heap := bench.WatchHeap(20 * time.Millisecond)
	start = time.Now()
	meter := newPartitionMeter(assetPart, int(parts), start, o.Timeout)
	rc.meter.Store(meter)
	if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
		heap.Stop()
		return nil, fmt.Errorf("commit the backlog's transaction: %w", err)
	}
	healthy := int64(records * (o.Subscriptions - unhealthy))
	limits := watchLimits(lanes, start)
	err = waitUntil(ctx, func() bool {
		if procs != nil {
			if procErr = procs.gone(); procErr != nil {
				return true
			}
		}
		return rc.backlog.Load() >= healthy
	})
	err = cmp.Or(procErr, err)
	limits.stop(res)
	goAfter := readGoRuntime()
	if err != nil {
		heap.Stop()
		_ = stop()
		return nil, fmt.Errorf("backlog not delivered (%d of %d): %w", rc.backlog.Load(), healthy, err)
	}
	res.DrainSeconds = time.Since(start).Seconds()
	res.GroupReassignedDuringDrain = !sameAssignment(ownedAtStart, groupAssignment(ctx, adm, group, topic))
	{
		inProcess := Result{MemberDeliveries: res.MemberDeliveries, MemberDoneSeconds: res.MemberDoneSeconds}
		meter.fill(owned, res)
		if procs == nil {
			res.MemberDeliveries, res.MemberDoneSeconds = inProcess.MemberDeliveries, inProcess.MemberDoneSeconds
		}
	}
	res.FirstDeliverySeconds = time.Unix(0, rc.firstBacklog.Load()).Sub(start).Seconds()
	res.DeliveriesPerSecond = float64(healthy) / res.DrainSeconds
	if err := prof.stop(); err != nil {
		heap.Stop()
		_ = stop()
		return nil, err
	}
	if pgAfter, ok := postgresCPU(dbName); ok && pgOK {
		res.PostgresCPUMicrosPerDelivery = float64((pgAfter - pgBefore).Microseconds()) / float64(res.Events)
	}
	res.ProcessCPUMicrosPerDelivery = float64((selfCPU() - selfBefore).Microseconds()) / float64(res.Events)
	if membersAfter, ok := procs.cpu(); ok && membersOK {
		res.MembersCPUMicrosPerDelivery = float64((membersAfter - membersBefore).Microseconds()) / float64(res.Events)
	}
	if busyAfter, allAfter, ok := machineCPU(); ok && machineOK && allAfter > allBefore {
		res.MachineCPUMicrosPerDelivery = float64((busyAfter - busyBefore).Microseconds()) / float64(res.Events)
		res.MachineBusyFraction = float64(busyAfter-busyBefore) / float64(allAfter-allBefore)
	}
	if kafkaAfter, ok := brokerCPU(); ok && kafkaOK {
		res.KafkaCPUMicrosPerDelivery = float64((kafkaAfter - kafkaBefore).Microseconds()) / float64(res.Events)
	}
	if res.MachineCPUMicrosPerDelivery > 0 && (procs == nil || res.MembersCPUMicrosPerDelivery > 0) {
		res.UnattributedCPUMicrosPerDelivery = res.MachineCPUMicrosPerDelivery - res.ProcessCPUMicrosPerDelivery -
			res.MembersCPUMicrosPerDelivery - res.PostgresCPUMicrosPerDelivery - res.KafkaCPUMicrosPerDelivery
	}
	goAfter.since(goBefore, res.Events, res)
	statsAfter := laneStats(lanes)
	res.Polls, res.AttemptLogFlushes = statsAfter.Polls-statsBefore.Polls, statsAfter.LogFlushes-statsBefore.LogFlushes
	res.OffsetCommits = statsAfter.Commits - statsBefore.Commits
	res.RouteChecks = statsAfter.RouteChecks - statsBefore.RouteChecks
	if res.AttemptLogFlushes > 0 {
		res.AttemptLogRowsPerFlush = float64(statsAfter.LogRows-statsBefore.LogRows) / float64(res.AttemptLogFlushes)
	}
	if res.CeilingPerSecond > 0 {
		res.CeilingFraction = res.DeliveriesPerSecond / res.CeilingPerSecond
	}
	res.PeakHeapMiB = bench.MiB(heap.Stop())
	o.Logger.InfoContext(ctx, "backlog drained", "elapsed_seconds", res.DrainSeconds, "per_second", int(res.DeliveriesPerSecond))
	liveRecords, err := fastLive(ctx, o, rc, res, records, unhealthy, func(j, n int) error {
		recs := make([]*kgo.Record, n)
		for i := range recs {
			recs[i] = next(j+i, true)
		}
		return cl.ProduceSync(ctx, recs...).FirstErr()
	})
	if err != nil {
		_ = stop()
		return nil, err
	}
	if err := stop(); err != nil {
		return nil, err
	}
	if err := procs.stop(); err != nil {
		return nil, err
	}
	for _, l := range lanes {
		st := l.Stats()
		res.HandedOver += st.HandedOver
		res.Isolations += st.Isolations
		res.RequestsCut += st.Cut
		if res.InFlightLimitMemberLowest == 0 || st.InFlightLimitLowest < res.InFlightLimitMemberLowest {
			res.InFlightLimitMemberLowest = st.InFlightLimitLowest
		}
		res.InFlightLimitMemberHighest = max(res.InFlightLimitMemberHighest, st.InFlightLimitHighest)
	}
	closePools() // the engine's backends exit and report their counters
	after, err := settledRowWrites(ctx, pool)
	if err != nil {
		return nil, err
	}
	n := float64(res.Events + liveRecords*o.Subscriptions)
	res.PostgresInsertsPerDelivery = float64(after.ins-before.ins) / n
	res.PostgresUpdatesPerDelivery = float64(after.upd-before.upd) / n
	res.PostgresDeletesPerDelivery = float64(after.del-before.del) / n
	rs := rc.Stats()
	res.OrderViolations, res.Duplicates = int64(rs.OrderViolations), int64(rs.Duplicates)
	res.Overlaps, res.SignatureFailures = int64(rs.Overlaps), int64(rs.SignatureFailures)
	if res.NotDelivered, err = store.NotDelivered(ctx, pool, subIDs[unhealthy:]); err != nil {
		return nil, err
	}
	res.PeakInFlightPerSub = rc.peakSub.Load()
	return res, nil
}

// fastLive is the fast lane's live phase, after the drain: LiveEvents
// deliveries (LiveEvents/Subscriptions records, each fanned out to every
// subscription) produced at LiveRate deliveries/s, one produce call per
// 10-ms tick (produce(j, n): records j … j+n-1 of the run), each record's
// payload carrying the time just before its produce. Latency is
// produce→received, of the healthy subscriptions only. It returns the
// records produced.
func fastLive(ctx context.Context, o Options, rc *receiver, res *Result, from, unhealthy int,
	produce func(j, n int) error) (int, error) {
	records := o.LiveEvents / o.Subscriptions
	res.LiveEvents = records * o.Subscriptions
	if records == 0 {
		return 0, nil
	}
	perTick := max(1, o.LiveRate/o.Subscriptions/100)
	t := time.NewTicker(10 * time.Millisecond)
	for sent := 0; sent < records; {
		<-t.C
		n := min(perTick, records-sent)
		if err := produce(from+sent, n); err != nil {
			t.Stop()
			return sent, fmt.Errorf("produce live records: %w", err)
		}
		sent += n
	}
	t.Stop()
	want := int64(records * (o.Subscriptions - unhealthy))
	if err := waitUntil(ctx, func() bool { return rc.live.Load() >= want }); err != nil {
		return records, fmt.Errorf("live events not delivered (%d of %d): %w", rc.live.Load(), want, err)
	}
	rc.mu.Lock()
	lat := slices.Clone(rc.latencies)
	rc.mu.Unlock()
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	res.LatencyP50MS = ms(lat[len(lat)*50/100])
	res.LatencyP99MS = ms(lat[min(len(lat)-1, len(lat)*99/100)])
	res.LatencyMaxMS = ms(lat[len(lat)-1])
	return records, nil
}

// spread reports whether the lanes own all parts partitions between them,
// each within one of the others: the group has formed and its rebalances
// (cooperative: a revoke, then the assignment) are over.
func spread(lanes []*fastlane.Lane, parts int) bool {
	total, lo, hi := 0, parts, 0
	for _, l := range lanes {
		n := len(l.Gauges().Partitions)
		total, lo, hi = total+n, min(lo, n), max(hi, n)
	}
	return total == parts && hi-lo <= 1
}

// laneStats sums the lanes' Stats.
func laneStats(lanes []*fastlane.Lane) fastlane.Stats {
	var sum fastlane.Stats
	for _, l := range lanes {
		st := l.Stats()
		sum.Polls += st.Polls
		sum.LogFlushes += st.LogFlushes
		sum.LogRows += st.LogRows
		sum.Commits += st.Commits
		sum.RouteChecks += st.RouteChecks
	}
	return sum
}

// limitWatch samples the sum of the members' live in-flight limits and
// each member's deliveries.
type limitWatch struct {
	done chan struct{}
	out  chan limitSamples
}

type limitSamples struct {
	sums []int64
	// delivered: each member's deliveries since the start at its last
	// sample; last: when they last grew, from the start.
	delivered []int64
	last      []time.Duration
}

// watchLimits samples the lanes every 50 ms until stop; the members'
// deliveries count from start.
func watchLimits(lanes []*fastlane.Lane, start time.Time) *limitWatch {
	w := &limitWatch{done: make(chan struct{}), out: make(chan limitSamples, 1)}
	base := make([]int64, len(lanes))
	for i, l := range lanes {
		base[i] = l.Stats().Delivered
	}
	go func() {
		ls := limitSamples{delivered: make([]int64, len(lanes)), last: make([]time.Duration, len(lanes))}
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			var sum int64
			now := time.Since(start)
			for i, l := range lanes {
				st := l.Stats()
				sum += st.InFlightLimit
				if d := st.Delivered - base[i]; d > ls.delivered[i] {
					ls.delivered[i], ls.last[i] = d, now
				}
			}
			ls.sums = append(ls.sums, sum)
			select {
			case <-w.done:
				w.out <- ls
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// stop ends the sampling and puts its median, lowest and highest sum and
// the members' deliveries in res.
func (w *limitWatch) stop(res *Result) {
	close(w.done)
	ls := <-w.out
	sums := ls.sums
	slices.Sort(sums)
	res.InFlightLimitSumMedian = sums[len(sums)/2]
	res.InFlightLimitSumLowest, res.InFlightLimitSumHighest = sums[0], sums[len(sums)-1]
	res.MemberDeliveries = ls.delivered
	for _, d := range ls.last {
		res.MemberDoneSeconds = append(res.MemberDoneSeconds, d.Seconds())
	}
}
