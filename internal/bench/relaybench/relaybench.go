// Package relaybench measures the relay on this machine (`bridge bench
// relay`): the drain rate of a backlog, commit→ack latency at an offered
// rate, per-key order read back from the topic and peak heap, next to the
// machine's ceilings measured in the same run; and, with Sustain, a steady
// load held for minutes (optionally with a transaction pinning the xmin
// horizon). It is never imported by a stage.
package relaybench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/bench"
	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
	"github.com/outboxbridge/bridge/internal/outboxstore"
	"github.com/outboxbridge/bridge/internal/relay"
)

// Options configures Run.
type Options struct {
	Events       int           // backlog drained (default 100000)
	Assets       int           // assets the backlog is spread over (default 1000)
	PayloadBytes int           // payload size (default 300)
	Partitions   int32         // partitions of the bench topic (default 6)
	Rate         int           // offered rate for the latency run, events/s (default 500)
	RateDuration time.Duration // length of the latency run (default 10s)
	Replicas     int           // relay replicas (default 1)
	// RelaysFirst starts the relays before the backlog is written and
	// writes it once they have spread the lanes between them; the drain is
	// timed from the backlog's commit. Otherwise the backlog is written
	// (and analyzed) first and the drain timed from the relays' start.
	RelaysFirst bool
	// Writers commit the latency run's transactions concurrently (default
	// one per 50 events/s offered, at least 4), on connections of their
	// own; each transaction holds TxEvents events (default 1). One event
	// per commit from one writer is fsync-bound on a small machine
	// (~600/s), and a commit that waits for a slow flush must find another
	// writer free for the next transaction on the schedule.
	Writers  int
	TxEvents int
}

// Result is what `bridge bench relay` prints. Field names are stable: new
// measurements are added, none is renamed.
type Result struct {
	// Topics are the scratch topics the run made on the broker (deleted
	// when it returns); not part of the -o json output.
	Topics []string `json:"-"`

	Events          int     `json:"events"`
	Assets          int     `json:"assets"`
	PayloadBytes    int     `json:"payload_bytes"`
	BatchSize       int     `json:"batch_size"`
	Replicas        int     `json:"replicas"`
	RelaysFirst     bool    `json:"relays_started_before_fill"`
	FillSeconds     float64 `json:"fill_seconds"`
	DrainSeconds    float64 `json:"drain_seconds"`
	DrainRate       float64 `json:"drain_events_per_second"`
	PeakHeapMiB     float64 `json:"peak_heap_mib"`
	BaselineHeapMiB float64 `json:"baseline_heap_mib"`
	// LatencyOffered is the rate asked for; LatencyAchieved the rate the
	// writers committed (a run short of the offered rate does not count).
	LatencyOffered  int     `json:"latency_offered_rate"`
	LatencyAchieved float64 `json:"latency_achieved_rate"`
	LatencyWriters  int     `json:"latency_writers"`
	LatencyTxEvents int     `json:"latency_tx_events"`
	LatencyEvents   int     `json:"latency_events"`
	// How late the writers began their transactions against the schedule
	// (p99 and max): a run whose writers fell behind offered bursts, not
	// the rate.
	LatencyWritersLateP99Ms float64 `json:"latency_writers_late_p99_ms"`
	LatencyWritersLateMaxMs float64 `json:"latency_writers_late_max_ms"`
	// Latencies run from the writer's COMMIT returning to the broker's
	// acknowledgement of the record reaching the relay's client.
	LatencyP50Ms float64 `json:"latency_p50_ms"`
	LatencyP99Ms float64 `json:"latency_p99_ms"`
	LatencyMaxMs float64 `json:"latency_max_ms"`
	// LatencySteps and LatencySlowSteps split commit→ack into the wait
	// for the claim that carried an event, the claim and produce until the
	// ack, averaged over every event and over those at or above the p99.
	LatencySteps     Breakdown `json:"latency_steps"`
	LatencySlowSteps Breakdown `json:"latency_p99_steps"`
	// LatencyDetail and LatencySlowDetail split it by what the relay was
	// doing meanwhile (see Detail).
	LatencyDetail     Detail `json:"latency_detail"`
	LatencySlowDetail Detail `json:"latency_p99_detail"`
	// The relays' produce requests while latencies were tracked: how many,
	// and their round trip (written to the response read) p50/p99/max.
	ProduceRequests     int     `json:"latency_produce_requests"`
	ProduceRequestP50Ms float64 `json:"latency_produce_request_p50_ms"`
	ProduceRequestP99Ms float64 `json:"latency_produce_request_p99_ms"`
	ProduceRequestMaxMs float64 `json:"latency_produce_request_max_ms"`
	// CeilingClaimMark is the one-statement claim+mark (claim NEW rows of
	// the topic in seq order with SKIP LOCKED and mark them SENT, no
	// payload returned, no lease or order check), measured on a backlog of
	// the same size as the drain's in a table of rows with a send status —
	// the outbox's shape before it became a log — in the same database:
	// kept under this name so numbers compare across versions, and the
	// reference a claim-and-mark design cannot pass.
	CeilingClaimMark float64 `json:"ceiling_postgres_claim_mark_rows_per_second"`
	// CeilingRelayStatements reads the same backlog size through the
	// relay's own statements one after the other (fence, batch pages with
	// payloads, the held rows' check, predecessor check, position save),
	// with no Kafka: what the relay's bookkeeping costs the database.
	CeilingRelayStatements float64 `json:"ceiling_postgres_relay_statements_rows_per_second"`
	CeilingProduce         float64 `json:"ceiling_kafka_produce_records_per_second"`
	// ClaimP50Ms/ClaimP99Ms are the relay's claim statement during the drain.
	ClaimP50Ms float64 `json:"drain_claim_p50_ms"`
	ClaimP99Ms float64 `json:"drain_claim_p99_ms"`
	ClaimMaxMs float64 `json:"drain_claim_max_ms"`
	// Verified is the number of drained records read back from the topic
	// (the ceilings write elsewhere); OrderViolations counts keys whose
	// asset-seq did not go 1, 2, 3, ... (first copy of each dedup-id),
	// which must be 0.
	Verified        int `json:"verified_records"`
	OrderViolations int `json:"order_violations"`
	// The outbox tables' row writes over the drain, from
	// pg_stat_user_tables (read once the relays' counters are flushed):
	// UPDATEs and DELETEs per drained event, and the dead tuples left at
	// its end.
	OutboxUpdatesPerEvent float64 `json:"outbox_updates_per_event"`
	OutboxDeletesPerEvent float64 `json:"outbox_deletes_per_event"`
	OutboxDeadTuples      int64   `json:"outbox_dead_tuples"`
}

// acks counts the broker's acknowledgements the relay's clients receive, per
// topic, and records when the watched dedup-ids were acknowledged. It is a
// franz-go hook, so it sees exactly what the relay sees.
type acks struct {
	topic atomic.Pointer[string]
	n     atomic.Int64
	lat   *latencies // nil: no latency tracking
}

func (a *acks) OnProduceRecordUnbuffered(r *kgo.Record, err error) {
	if err != nil {
		return
	}
	if t := a.topic.Load(); t != nil && *t == r.Topic {
		a.n.Add(1)
	}
	if l := a.lat; l != nil && l.active.Load() {
		if m, err := contract.Decode(r); err == nil {
			l.acked(m.DedupID, time.Now())
		}
	}
}

// OnProduceRecordBuffered records when the relay handed a watched record to
// its client.
func (a *acks) OnProduceRecordBuffered(r *kgo.Record) {
	if l := a.lat; l != nil && l.active.Load() {
		if m, err := contract.Decode(r); err == nil {
			l.handed(m.DedupID, time.Now())
		}
	}
}

// OnBrokerE2E records the round trip of each produce request (write to
// response read) while latencies are tracked: the broker's own share of
// commit→ack, on the relay's connection.
func (a *acks) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if l := a.lat; l != nil && key == 0 && e2e.Err() == nil {
		l.produceRequest(e2e.DurationE2E())
	}
}

// Run fills the outbox of pool (a scratch database) and measures the relay
// against the broker client talks to, next to the machine's ceilings measured
// in the same run with the same batch size: PostgreSQL claim+mark alone (two
// ways, see Result) and Kafka produce alone.
func Run(ctx context.Context, pool *pgxpool.Pool, kafkaOpts []kgo.Opt, cfg relay.Config, o Options, progress func(string)) (*Result, error) {
	cfg = cfg.WithDefaults()
	o.Events = cmp.Or(o.Events, 100000)
	o.Assets = cmp.Or(o.Assets, 1000)
	o.PayloadBytes = cmp.Or(o.PayloadBytes, 300)
	o.Partitions = cmp.Or(o.Partitions, 6)
	o.Rate = cmp.Or(o.Rate, 500)
	o.RateDuration = cmp.Or(o.RateDuration, 10*time.Second)
	o.Replicas = cmp.Or(o.Replicas, 1)
	o.Writers = cmp.Or(o.Writers, max(4, o.Rate/50))
	o.TxEvents = cmp.Or(o.TxEvents, 1)
	if progress == nil {
		progress = func(string) {}
	}
	res := &Result{Events: o.Events, Assets: o.Assets, PayloadBytes: o.PayloadBytes, BatchSize: cfg.BatchSize, Replicas: o.Replicas, RelaysFirst: o.RelaysFirst,
		LatencyWriters: o.Writers, LatencyTxEvents: o.TxEvents}

	lat := newLatencies()
	hook := &acks{lat: lat}
	newClient := func() (*kgo.Client, error) {
		return kgo.NewClient(append(slices.Clone(kafkaOpts), append(relay.ProducerOptions(cfg), kgo.WithHooks(hook))...)...)
	}
	adm, closeAdmin, err := scratchTopicAdmin(ctx, kafkaOpts, &res.Topics)
	if err != nil {
		return nil, err
	}
	defer closeAdmin() // registered before the producers: runs after they are closed
	client, err := newClient()
	if err != nil {
		return nil, err
	}
	defer client.Close()
	newTopic := func(kind string) (string, error) {
		name := fmt.Sprintf("bridge-bench-%s-%d", kind, time.Now().UnixNano())
		if err := createTopic(ctx, adm, name, o.Partitions); err != nil {
			return "", err
		}
		res.Topics = append(res.Topics, name)
		return name, nil
	}
	topic, err := newTopic("relay")
	if err != nil {
		return nil, err
	}

	// Ceiling 1: Kafka produce alone, same client options and batch size, on
	// a topic of its own (its records must not count as drained ones).
	progress("measuring the Kafka produce ceiling")
	ceilTopic, err := newTopic("produce-ceiling")
	if err != nil {
		return nil, err
	}
	ceilClient, err := newClient()
	if err != nil {
		return nil, err
	}
	res.CeilingProduce, err = produceCeiling(ctx, ceilClient, ceilTopic, min(o.Events, 200000), o.PayloadBytes, cfg.BatchSize)
	ceilClient.Close()
	if err != nil {
		return nil, err
	}

	// Ceilings 2 and 3: PostgreSQL alone, on the same table and a backlog of
	// the drain's size; each leaves the table vacuumed for the next step, so
	// the drain does not wade through the ceilings' dead rows.
	progress(fmt.Sprintf("measuring the PostgreSQL ceilings on %d rows", o.Events))
	if res.CeilingClaimMark, err = claimMarkCeiling(ctx, pool, cfg, o.Events, o.Assets, o.PayloadBytes); err != nil {
		return nil, err
	}
	if res.CeilingRelayStatements, err = relayStatementsCeiling(ctx, pool, cfg, o.Events, o.Assets, o.PayloadBytes); err != nil {
		return nil, err
	}

	// The backlog: before the relays start, or (RelaysFirst) once they
	// have spread the lanes between them, so that a run with several
	// replicas does not time their hand-over of lanes at start.
	fill := func() error {
		progress(fmt.Sprintf("filling the outbox with %d events over %d assets", o.Events, o.Assets))
		started := time.Now()
		if err := outboxstore.BenchFill(ctx, pool, o.Events, topic, o.Assets, o.PayloadBytes); err != nil {
			return err
		}
		res.FillSeconds = time.Since(started).Seconds()
		return nil
	}
	if !o.RelaysFirst {
		if err := fill(); err != nil {
			return nil, err
		}
		if err := outboxstore.BenchAnalyze(ctx, pool); err != nil {
			return nil, err
		}
	}

	res.BaselineHeapMiB = bench.MiB(bench.HeapInuseNow())
	heap := bench.WatchHeap(20 * time.Millisecond)
	writesBefore, err := settledWrites(ctx, pool)
	if err != nil {
		return nil, err
	}

	progress(fmt.Sprintf("draining with %d relay replica(s)", o.Replicas))
	claims := &durations{}
	rc := cfg
	rc.ClaimObserver = func(d time.Duration, _ int) { claims.add(d); lat.claimed(d) }
	rc.CycleObserver = lat.cycled
	hook.topic.Store(&topic)
	runCtx, stopRelays := context.WithCancel(ctx)
	var relays sync.WaitGroup
	var clients []*kgo.Client
	var running []*relay.Relay
	start := time.Now()
	var pools []*pgxpool.Pool
	defer func() {
		stopRelays()
		relays.Wait()
		for _, c := range clients {
			c.Close()
		}
		for _, p := range pools {
			p.Close()
		}
	}()
	for i := range o.Replicas {
		c, rp := client, pool
		if i > 0 {
			if c, err = newClient(); err != nil {
				return nil, err
			}
			clients = append(clients, c)
			if rp, err = replicaPool(ctx, pool); err != nil {
				return nil, err
			}
			pools = append(pools, rp)
		}
		rc := rc
		rc.MemberID = ""
		r := relay.New(rp, c, rc)
		running = append(running, r)
		relays.Add(1)
		go func() { defer relays.Done(); _ = r.Run(runCtx) }()
	}
	if o.RelaysFirst {
		if err := waitLanesSpread(ctx, running); err != nil {
			return nil, err
		}
		if err := fill(); err != nil {
			return nil, err
		}
		start = time.Now() // the rows became visible at the fill's commit
	}
	if err := waitAcked(ctx, hook, int64(o.Events)); err != nil {
		return nil, err
	}
	// Drained once the broker acknowledged every event; the lanes' positions
	// are saved within a second after (waitDrained).
	res.DrainSeconds = time.Since(start).Seconds()
	if err := waitDrained(ctx, pool, topic, nil, 0); err != nil {
		return nil, err
	}
	res.DrainRate = float64(o.Events) / res.DrainSeconds
	res.PeakHeapMiB = bench.MiB(heap.Stop())
	res.ClaimP50Ms, res.ClaimP99Ms, res.ClaimMaxMs = claims.percentiles()
	writesAfter, err := settledWrites(ctx, pool)
	if err != nil {
		return nil, err
	}
	if o.RelaysFirst {
		// The fill ran after the first reading: its own writes are not the drain's.
		writesAfter.Inserts -= int64(o.Events)
	}
	drained := writesAfter.Sub(writesBefore)
	res.OutboxUpdatesPerEvent = float64(drained.Updates) / float64(o.Events)
	res.OutboxDeletesPerEvent = float64(drained.Deletes) / float64(o.Events)
	res.OutboxDeadTuples = drained.Dead

	progress("reading the topic back to verify per-key order")
	if res.Verified, res.OrderViolations, err = verifyOrder(ctx, kafkaOpts, topic, o.Events); err != nil {
		return nil, err
	}

	// Latency at a fixed offered rate: transactions of TxEvents events from
	// Writers writers, commit → the broker's ack, relays running.
	progress(fmt.Sprintf("offering %d events/s for %s (%d writers, %d event(s) per transaction)", o.Rate, o.RateDuration, o.Writers, o.TxEvents))
	res.LatencyOffered = o.Rate
	hook.topic.Store(nil)
	// The writers have a pool of their own, as an application's writers
	// would: sharing the relays' (its LISTENs hold two connections) made
	// them queue for a connection inside the measured schedule.
	wcfg := pool.Config().Copy()
	wcfg.MaxConns, wcfg.MinConns = int32(o.Writers), 0
	writersPool, err := pgxpool.NewWithConfig(ctx, wcfg)
	if err != nil {
		return nil, fmt.Errorf("writers' pool: %w", err)
	}
	pools = append(pools, writersPool)
	late := &durations{}
	lr, err := offer(ctx, writersPool, Load{Topic: topic, Assets: o.Assets, Rate: o.Rate, Duration: o.RateDuration, Writers: o.Writers, TxEvents: o.TxEvents,
		OnLate: late.add, WarmWrites: true}, lat)
	if err != nil {
		return nil, err
	}
	_, res.LatencyWritersLateP99Ms, res.LatencyWritersLateMaxMs = late.percentiles()
	if err := waitDrained(ctx, pool, topic, nil, 0); err != nil {
		return nil, err
	}
	res.LatencyAchieved = lr.achieved
	res.LatencyEvents, res.LatencyP50Ms, res.LatencyP99Ms, res.LatencyMaxMs = lat.summary()
	res.LatencySteps, res.LatencySlowSteps = lat.breakdown()
	res.LatencyDetail, res.LatencySlowDetail = lat.detail()
	res.ProduceRequests, res.ProduceRequestP50Ms, res.ProduceRequestP99Ms, res.ProduceRequestMaxMs = lat.produceRequests()
	_ = outboxstore.DeleteTopic(context.WithoutCancel(ctx), pool, topic)
	return res, nil
}

// settledWrites reads the outbox tables' row counters once every backend
// has flushed its own (each does so at most once a second, when idle): two
// equal readings 1.2 s apart, or the last one after 6 s.
func settledWrites(ctx context.Context, pool *pgxpool.Pool) (outboxstore.Writes, error) {
	last, err := outboxstore.TableWrites(ctx, pool)
	if err != nil {
		return last, err
	}
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-time.After(1200 * time.Millisecond):
		}
		now, err := outboxstore.TableWrites(ctx, pool)
		if err != nil {
			return now, err
		}
		if now == last {
			return now, nil
		}
		last = now
	}
	return last, nil
}

// waitLanesSpread waits until the relays hold every lane between them, each
// no more than its fair share (the lanes stop moving).
func waitLanesSpread(ctx context.Context, relays []*relay.Relay) error {
	fair := (relay.LaneCount + len(relays) - 1) / len(relays)
	deadline := time.Now().Add(time.Minute)
	for {
		total, spread := 0, true
		for _, r := range relays {
			n := len(r.OwnedLanes())
			total += n
			spread = spread && n > 0 && n <= fair
		}
		if spread && total == relay.LaneCount {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("relays did not spread the %d lanes within a minute (%d held)", relay.LaneCount, total)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// replicaPool is a pool of its own for a further replica, with the first
// one's settings: replicas in separate processes do not share connections,
// and a shared pool would make them queue for each other's.
func replicaPool(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Pool, error) {
	p, err := pgxpool.NewWithConfig(ctx, pool.Config().Copy())
	if err != nil {
		return nil, fmt.Errorf("replica pool: %w", err)
	}
	return p, nil
}

// waitDrained waits until the relays' clients saw want acknowledgements for
// topic (when hook is set), then until no NEW row of topic is left (the last
// settlement written). The count of NEW rows is a scan of the table, so it is
// asked only at the end and at most every 50 ms: polling it throughout would
// compete with the relay it measures.
func waitDrained(ctx context.Context, pool *pgxpool.Pool, topic string, hook *acks, want int64) error {
	if err := waitAcked(ctx, hook, want); err != nil {
		return err
	}
	for {
		n, err := outboxstore.BenchCountNew(ctx, pool, topic)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitAcked waits until the relays' clients saw want acknowledgements (nil
// hook: at once).
func waitAcked(ctx context.Context, hook *acks, want int64) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for hook != nil && hook.n.Load() < want {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// claimMarkCeiling measures the one-statement claim+mark (see
// Result.CeilingClaimMark) on n fresh rows of a topic of their own.
func claimMarkCeiling(ctx context.Context, pool *pgxpool.Pool, cfg relay.Config, n, assets, size int) (float64, error) {
	topic := fmt.Sprintf("bridge-bench-ceiling-%d", time.Now().UnixNano())
	if err := outboxstore.BenchFillRowTable(ctx, pool, n, topic, assets, size); err != nil {
		return 0, err
	}
	defer func() { _ = outboxstore.BenchDropRowTable(context.WithoutCancel(ctx), pool) }()
	start := time.Now()
	done := int64(0)
	for done < int64(n) {
		k, err := outboxstore.BenchClaimMark(ctx, pool, topic, cfg.BatchSize)
		if err != nil {
			return 0, err
		}
		if k == 0 {
			break
		}
		done += k
	}
	return float64(done) / time.Since(start).Seconds(), nil
}

// relayStatementsCeiling measures the relay's own statements (see
// Result.CeilingRelayStatements) on n fresh rows.
func relayStatementsCeiling(ctx context.Context, pool *pgxpool.Pool, cfg relay.Config, n, assets, size int) (float64, error) {
	topic := fmt.Sprintf("bridge-bench-statements-%d", time.Now().UnixNano())
	if err := fillAnalyzed(ctx, pool, n, topic, assets, size); err != nil {
		return 0, err
	}
	defer cleanUp(ctx, pool, topic)
	cfg.MemberID = ""
	marked, took, err := relay.StatementCeiling(ctx, pool, cfg)
	if err != nil {
		return 0, err
	}
	if marked != n {
		return 0, fmt.Errorf("statement ceiling read %d of %d rows", marked, n)
	}
	return float64(marked) / took.Seconds(), nil
}

func fillAnalyzed(ctx context.Context, pool *pgxpool.Pool, n int, topic string, assets, size int) error {
	if err := outboxstore.BenchFill(ctx, pool, n, topic, assets, size); err != nil {
		return err
	}
	return outboxstore.BenchAnalyze(ctx, pool)
}

// cleanUp empties the log after a ceiling (the scratch database holds
// nothing else yet), so the drain starts on empty tables.
func cleanUp(ctx context.Context, pool *pgxpool.Pool, _ string) {
	_ = outboxstore.BenchEmptyLog(context.WithoutCancel(ctx), pool)
}

// durations collects the claim's durations (safe for concurrent use).
type durations struct {
	mu sync.Mutex
	ds []float64 // ms
}

func (d *durations) add(x time.Duration) {
	d.mu.Lock()
	d.ds = append(d.ds, float64(x.Microseconds())/1000)
	d.mu.Unlock()
}

func (d *durations) percentiles() (p50, p99, maxMs float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return percentile(d.ds, 0.50), percentile(d.ds, 0.99), percentile(d.ds, 1)
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// createTopic creates a bench topic and waits until every partition has a
// leader. Right after a long run the broker is still deleting that run's
// topic (millions of records), and a new topic's leaders took longer than
// the produce timeout to appear: the first record failed with "records have
// timed out" (the relaybench test, run after a 10-minute bench, with a 5 s
// timeout), though nothing was wrong with the relay or the bench.
// scratchTopicAdmin returns the admin client that creates a run's topics
// and a close function that deletes every topic named in *topics, then
// closes the client. Call close only after every producer of the run is
// closed: the bench's producers take the relay's options, which allow the
// broker to auto-create topics, and a producer that still knows a deleted
// topic re-creates it at its next metadata refresh (one produce-ceiling
// topic per run piled up on the broker that way, the ceiling's producer
// being the drain's). This client never produces, so it re-creates nothing.
func scratchTopicAdmin(ctx context.Context, kafkaOpts []kgo.Opt, topics *[]string) (*kadm.Client, func(), error) {
	cl, err := kgo.NewClient(kafkaOpts...)
	if err != nil {
		return nil, nil, err
	}
	adm := kadm.NewClient(cl)
	return adm, func() {
		if len(*topics) > 0 {
			_, _ = adm.DeleteTopics(context.WithoutCancel(ctx), *topics...)
		}
		cl.Close()
	}, nil
}

func createTopic(ctx context.Context, adm *kadm.Client, name string, partitions int32) error {
	if _, err := adm.CreateTopic(ctx, partitions, -1, nil, name); err != nil {
		return fmt.Errorf("create bench topic: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := kafkaclient.WaitTopicReady(wctx, adm, name, int(partitions), 1); err != nil {
		return fmt.Errorf("bench topic %s has no leader for every partition: %w", name, err)
	}
	return nil
}

// warmUp produces one record that is not measured (nor counted: it has no
// dedup-id), so the measurement does not include the client learning the
// topic's metadata. A timed-out attempt is tried again, within a minute, for
// the reason createTopic waits.
func warmUp(ctx context.Context, client *kgo.Client, topic string, value []byte) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := client.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("warm-up"), Value: value}).FirstErr()
		if err == nil || !errors.Is(err, kgo.ErrRecordTimeout) || time.Now().After(deadline) {
			return err
		}
	}
}

func produceCeiling(ctx context.Context, client *kgo.Client, topic string, n, size, batch int) (float64, error) {
	value := []byte(`"` + string(make([]byte, 0)) + `"`)
	if size > 2 {
		buf := make([]byte, size)
		buf[0], buf[size-1] = '"', '"'
		for i := 1; i < size-1; i++ {
			buf[i] = 'x'
		}
		value = buf
	}
	// Warm up: the first record waits for the new topic's metadata, which is
	// not produce throughput.
	if err := warmUp(ctx, client, topic, value); err != nil {
		return 0, fmt.Errorf("produce ceiling: %w", err)
	}
	start := time.Now()
	for sent := 0; sent < n; {
		k := min(batch, n-sent)
		var wg sync.WaitGroup
		var firstErr atomic.Value
		wg.Add(k)
		for i := range k {
			// The relay's own record shape (headers included), so the ceiling
			// is what the broker takes of the records the relay sends.
			asset := fmt.Sprintf("ceiling-%d", (sent+i)%1000)
			rec := contract.Encode(contract.Event{DedupID: uuid.NewString(), Topic: topic, AssetID: &asset,
				AssetSeq: int64(sent + i + 1), EventType: "bench.ceiling", Payload: value})
			client.Produce(ctx, rec, func(_ *kgo.Record, err error) {
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
				wg.Done()
			})
		}
		wg.Wait()
		if e := firstErr.Load(); e != nil {
			return 0, fmt.Errorf("produce ceiling: %w", e.(error))
		}
		sent += k
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// verifyOrder reads the topic from the start and checks that, per key, the
// first copy of each dedup-id carries asset-seq 1, 2, 3, ... in offset order.
func verifyOrder(ctx context.Context, kafkaOpts []kgo.Opt, topic string, want int) (read, violations int, err error) {
	cl, err := kgo.NewClient(append(slices.Clone(kafkaOpts), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	seen := map[string]bool{}
	next := map[string]int64{}
	bad := map[string]bool{}
	deadline, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for read < want {
		fs := cl.PollFetches(deadline)
		if deadline.Err() != nil {
			return read, len(bad), fmt.Errorf("read back %d of %d records: %w", read, want, deadline.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			m, err := contract.Decode(r)
			id := m.DedupID
			if seen[id] {
				return
			}
			seen[id] = true
			read++
			// Keys may not start at asset-seq 1 (earlier events of the asset),
			// but from the first one seen each must follow its predecessor.
			k := string(r.Key)
			var n int64
			if err == nil && m.AssetSeq != nil {
				n = *m.AssetSeq
			}
			if exp, ok := next[k]; ok && n != exp {
				bad[k] = true
			}
			next[k] = n + 1
		})
	}
	return read, len(bad), nil
}
