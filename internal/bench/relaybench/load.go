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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/outboxstore"
	"github.com/outboxbridge/bridge/internal/relay"
	"github.com/outboxbridge/bridge/outbox"
)

// latencies matches each committed event with the broker's ack of its record
// and keeps commit→ack in milliseconds, with the ack time (for per-minute
// figures). Only events registered while active are tracked, so a drain's
// acks cost nothing here.
type latencies struct {
	active    atomic.Bool
	mu        sync.Mutex
	committed map[string]time.Time // dedup-id → commit returned, not acked yet
	early     map[string]sample    // acked before the writer recorded its commit (ms unset)
	buffered  map[string]time.Time // dedup-id → handed to the relay's client, not acked yet
	samples   []sample
	claims    []claimSpan        // the relays' claim statements while active, by end
	cycles    []relay.CycleTimes // the relays' cycles while active, in order
	requests  []float64          // the relays' produce requests' round trips while active, ms
}

// produceRequest records one produce request's round trip, while active.
func (l *latencies) produceRequest(d time.Duration) {
	if !l.active.Load() {
		return
	}
	l.mu.Lock()
	l.requests = append(l.requests, d.Seconds()*1000)
	l.mu.Unlock()
}

// produceRequests returns how many produce requests were recorded and the
// p50, p99 and max of their round trips.
func (l *latencies) produceRequests() (n int, p50, p99, maxMs float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	xs := slices.Clone(l.requests)
	return len(xs), percentile(xs, 0.5), percentile(xs, 0.99), percentile(xs, 1)
}

// cycled records a relay cycle, while active.
func (l *latencies) cycled(c relay.CycleTimes) {
	if !l.active.Load() {
		return
	}
	l.mu.Lock()
	l.cycles = append(l.cycles, c)
	l.mu.Unlock()
}

// Detail splits commit→ack by what the relay was doing, averaged over a set
// of events (exact with one relay). From the COMMIT returning to the start
// of the claim that carried the event, the relay was idle (WakeMs: waiting
// for the NOTIFY to reach it), or busy with another cycle: its claim
// (BusyClaimMs), its produce until acked (BusyProduceMs), or the wait for
// the marks of the batch before it (BusyMarksMs). Then the carrying cycle:
// its claim (ClaimMs), building and handing the records to the client
// (BuildMs), and from there to the broker's ack (BrokerMs). The parts add
// up to commit→ack.
type Detail struct {
	Events        int     `json:"events"`
	WakeMs        float64 `json:"wake_ms"`
	BusyClaimMs   float64 `json:"busy_claim_ms"`
	BusyProduceMs float64 `json:"busy_produce_ms"`
	BusyMarksMs   float64 `json:"busy_marks_ms"`
	ClaimMs       float64 `json:"claim_ms"`
	BuildMs       float64 `json:"build_ms"`
	BrokerMs      float64 `json:"broker_ms"`
}

// detail returns the Detail of all matched events and of those at or above
// the p99.
func (l *latencies) detail() (all, slow Detail) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cycles := slices.Clone(l.cycles)
	slices.SortFunc(cycles, func(a, b relay.CycleTimes) int { return a.ClaimStart.Compare(b.ClaimStart) })
	xs := make([]float64, len(l.samples))
	for i, s := range l.samples {
		xs[i] = float64(s.ms)
	}
	p99 := percentile(xs, 0.99)
	ms := func(a, b time.Time) float64 {
		if a.IsZero() || b.IsZero() || !b.After(a) {
			return 0
		}
		return b.Sub(a).Seconds() * 1000
	}
	// overlap is how much of [from, to] lies in [a, b].
	overlap := func(from, to, a, b time.Time) float64 {
		if a.IsZero() || b.IsZero() {
			return 0
		}
		if a.Before(from) {
			a = from
		}
		if b.After(to) {
			b = to
		}
		return ms(a, b)
	}
	add := func(d *Detail, s sample) {
		commit := s.at.Add(-time.Duration(float64(s.ms) * float64(time.Millisecond)))
		// The carrying cycle: the last one whose claim ended before the
		// record was handed to the client.
		end := s.handedOrAcked()
		i, _ := slices.BinarySearchFunc(cycles, end, func(c relay.CycleTimes, t time.Time) int { return c.ClaimStart.Compare(t) })
		for i--; i >= 0 && (cycles[i].ClaimEnd.After(end) || cycles[i].Produced.IsZero()); i-- {
		}
		if i < 0 {
			return
		}
		c := cycles[i]
		d.Events++
		from, to := commit, c.ClaimStart
		for j := i; j >= 0; j-- {
			p := cycles[j]
			if j < i && p.Settled.Before(from) {
				break // this cycle and every earlier one ended before the commit
			}
			if !p.IdleFrom.IsZero() {
				d.WakeMs += overlap(from, to, p.IdleFrom, p.ClaimStart)
			}
			if j == i {
				continue
			}
			d.BusyClaimMs += overlap(from, to, p.ClaimStart, p.ClaimEnd)
			ackedOrClaimed := p.Acked
			if ackedOrClaimed.IsZero() {
				ackedOrClaimed = p.ClaimEnd
			}
			d.BusyProduceMs += overlap(from, to, p.ClaimEnd, ackedOrClaimed)
			d.BusyMarksMs += overlap(from, to, ackedOrClaimed, p.Settled)
		}
		claimFrom := c.ClaimStart
		if commit.After(claimFrom) {
			claimFrom = commit // the ack came before the writer heard its COMMIT return
		}
		d.ClaimMs += ms(claimFrom, c.ClaimEnd)
		d.BuildMs += ms(c.ClaimEnd, c.Produced)
		d.BrokerMs += ms(c.Produced, s.at)
	}
	for _, s := range l.samples {
		add(&all, s)
		if float64(s.ms) >= p99 {
			add(&slow, s)
		}
	}
	for _, d := range []*Detail{&all, &slow} {
		if n := float64(d.Events); n > 0 {
			d.WakeMs, d.BusyClaimMs, d.BusyProduceMs, d.BusyMarksMs = d.WakeMs/n, d.BusyClaimMs/n, d.BusyProduceMs/n, d.BusyMarksMs/n
			d.ClaimMs, d.BuildMs, d.BrokerMs = d.ClaimMs/n, d.BuildMs/n, d.BrokerMs/n
		}
	}
	return all, slow
}

// claimSpan is one claim statement of a relay (start and end).
type claimSpan struct{ start, end time.Time }

// claimed records a claim statement that ended now, while active.
func (l *latencies) claimed(took time.Duration) {
	if !l.active.Load() {
		return
	}
	end := time.Now()
	l.mu.Lock()
	l.claims = append(l.claims, claimSpan{end.Add(-took), end})
	l.mu.Unlock()
}

// Breakdown splits commit→ack into its steps, averaged over a set of events:
// Wait from the COMMIT returning to the start of the claim that carried the
// event (the NOTIFY, and whatever the relay was doing meanwhile), Claim the
// claim statement, Produce from its end to the broker's ack (building the
// records, produce, ack). Produce is split in turn into HandMs, until the
// record is handed to the client (building it, or waiting for an earlier
// batch of its asset), and AckMs, from there to the ack. Missed is the
// share of the events whose carrying claim was not the first one started
// after their commit.
type Breakdown struct {
	Events    int     `json:"events"`
	WaitMs    float64 `json:"wait_ms"`
	ClaimMs   float64 `json:"claim_ms"`
	ProduceMs float64 `json:"produce_ms"`
	HandMs    float64 `json:"hand_ms"`
	AckMs     float64 `json:"ack_ms"`
	Missed    float64 `json:"missed_share"`
}

// breakdown returns the steps of all matched events and of those at or
// above the p99. The carrying claim is the last one that ended before the
// record was handed to the client (exact with one relay).
func (l *latencies) breakdown() (all, slow Breakdown) {
	l.mu.Lock()
	defer l.mu.Unlock()
	claims := slices.Clone(l.claims)
	slices.SortFunc(claims, func(a, b claimSpan) int { return a.end.Compare(b.end) })
	starts := make([]time.Time, len(claims))
	for i, c := range claims {
		starts[i] = c.start
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	xs := make([]float64, len(l.samples))
	for i, s := range l.samples {
		xs[i] = float64(s.ms)
	}
	p99 := percentile(xs, 0.99)
	add := func(b *Breakdown, s sample) {
		commit := s.at.Add(-time.Duration(float64(s.ms) * float64(time.Millisecond)))
		i, _ := slices.BinarySearchFunc(claims, s.handedOrAcked(), func(c claimSpan, t time.Time) int { return c.end.Compare(t) })
		if i == 0 {
			return
		}
		c := claims[i-1]
		b.Events++
		b.WaitMs += c.start.Sub(commit).Seconds() * 1000
		b.ClaimMs += c.end.Sub(c.start).Seconds() * 1000
		b.ProduceMs += s.at.Sub(c.end).Seconds() * 1000
		b.HandMs += s.handedOrAcked().Sub(c.end).Seconds() * 1000
		b.AckMs += s.at.Sub(s.handedOrAcked()).Seconds() * 1000
		if j, _ := slices.BinarySearchFunc(starts, commit, func(a, t time.Time) int { return a.Compare(t) }); j < len(starts) && starts[j].Before(c.start) {
			b.Missed++
		}
	}
	for _, s := range l.samples {
		add(&all, s)
		if float64(s.ms) >= p99 {
			add(&slow, s)
		}
	}
	for _, b := range []*Breakdown{&all, &slow} {
		if n := float64(b.Events); n > 0 {
			b.WaitMs, b.ClaimMs, b.ProduceMs, b.Missed = b.WaitMs/n, b.ClaimMs/n, b.ProduceMs/n, b.Missed/n
			b.HandMs, b.AckMs = b.HandMs/n, b.AckMs/n
		}
	}
	return all, slow
}

type sample struct {
	at  time.Time // acked
	buf time.Time // handed to the client (zero: not seen)
	ms  float32
}

// handedOrAcked is when the carrying claim must have ended by: the record's
// handing to the client (a claim that ends after it, before the ack, did
// not carry it), or its ack when that was not seen.
func (s sample) handedOrAcked() time.Time {
	if s.buf.IsZero() {
		return s.at
	}
	return s.buf
}

func newLatencies() *latencies {
	return &latencies{committed: map[string]time.Time{}, early: map[string]sample{}, buffered: map[string]time.Time{}}
}

func (l *latencies) setActive(on bool) { l.active.Store(on) }

func (l *latencies) commit(ids []string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if e, ok := l.early[id]; ok {
			// The relay can ack before the writer's COMMIT call returns to
			// it; the commit is then no later than the ack.
			delete(l.early, id)
			e.ms = float32(max(0, e.at.Sub(at).Seconds()*1000))
			l.samples = append(l.samples, e)
			continue
		}
		l.committed[id] = at
	}
}

// handed records when the relay handed an event's record to its client.
func (l *latencies) handed(id string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.buffered[id]; !ok {
		l.buffered[id] = at
	}
}

func (l *latencies) acked(id string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	buf := l.buffered[id]
	delete(l.buffered, id)
	c, ok := l.committed[id]
	if !ok {
		l.early[id] = sample{at: at, buf: buf}
		return
	}
	delete(l.committed, id)
	l.samples = append(l.samples, sample{at: at, buf: buf, ms: float32(at.Sub(c).Seconds() * 1000)})
}

// summary returns how many events were matched and their p50, p99 and max.
func (l *latencies) summary() (n int, p50, p99, maxMs float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	xs := make([]float64, len(l.samples))
	for i, s := range l.samples {
		xs[i] = float64(s.ms)
	}
	return len(xs), percentile(xs, 0.5), percentile(xs, 0.99), percentile(xs, 1)
}

type loadResult struct {
	events   int
	achieved float64 // events/s committed
}

// offer runs the load, registering each committed event with lat.
func offer(ctx context.Context, pool *pgxpool.Pool, ld Load, lat *latencies) (loadResult, error) {
	lat.setActive(true)
	n, achieved, err := Offer(ctx, pool, ld, lat.commit)
	return loadResult{events: n, achieved: achieved}, err
}

// Load is an offered load: Rate events/s over Assets assets in transactions
// of TxEvents events, committed by Writers concurrent writers on a fixed
// schedule for Duration. `bench pipeline` offers its load with it too.
type Load struct {
	Topic    string
	Assets   int
	Rate     int
	Duration time.Duration
	Writers  int
	TxEvents int
	// EventType of every event offered; default "bench.live", the type
	// the benches measure (a warm-up load uses another, so no figure
	// counts it).
	EventType string
	// EndAtDuration stops offering once Duration has passed, however far
	// behind the schedule the writers are: transactions not begun by then
	// are never offered. A held xmin slowed the writers to a fifth of the
	// rate, and a run that waited for the whole schedule did not end in 17
	// minutes (nor print what the writers managed); the achieved rate says
	// how far short they fell.
	EndAtDuration bool
	// OnTx, if set, is told each committed transaction's begin time and how
	// long it took (BEGIN to COMMIT returned): the writers' own cost.
	OnTx func(began time.Time, took time.Duration)
	// OnLate, if set, is told how late each transaction began against its
	// place on the schedule (0 when on time).
	OnLate func(late time.Duration)
	// WarmWrites makes the warm-up of each writer's connection enqueue one
	// event in a transaction it rolls back (see warmConnections). The
	// rolled-back row is a dead tuple: a run that counts dead tuples over
	// the load leaves it off.
	WarmWrites bool
}

// Offer commits the load through outbox.EnqueueBatch, calling onCommit
// with each transaction's dedup ids and the time its COMMIT returned. It
// returns how many events were committed and the rate achieved.
//
// The load is open-loop: one scheduler hands each transaction, at its time
// on the schedule, to whichever writer is free, so a slow commit delays
// only itself. With a fixed round-robin of transactions over writers, a
// writer whose commit waited for a WAL flush fell behind its own schedule
// and caught up in a burst of back-to-back commits: the writers reached
// 671–795 of 1,000 events/s offered, and the relay's p99 measured those
// bursts. The writers' connections are opened before the schedule starts
// (warmConnections), so no first transaction pays for a connection.
func Offer(ctx context.Context, pool *pgxpool.Pool, ld Load, onCommit func(ids []string, at time.Time)) (events int, achieved float64, err error) {
	txs := max(1, int(float64(ld.Rate)*ld.Duration.Seconds())/ld.TxEvents)
	every := time.Duration(float64(time.Second) * float64(ld.TxEvents) / float64(ld.Rate))
	var warm func(context.Context, *pgxpool.Conn)
	if ld.WarmWrites {
		warm = func(ctx context.Context, c *pgxpool.Conn) {
			tx, err := c.Begin(ctx)
			if err != nil {
				return
			}
			_, _ = outbox.EnqueueBatch(ctx, tx, []outbox.Event{{Topic: ld.Topic, AssetID: "bench-warm-up", EventType: "bench.warm_up", Payload: []byte(`{}`)}})
			_ = tx.Rollback(ctx)
		}
	}
	warmConnections(ctx, pool, ld.Writers, warm)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type scheduled struct {
		tx int
		at time.Time
	}
	due := make(chan scheduled) // unbuffered: a transaction goes only to a free writer
	start := time.Now()
	go func() {
		defer close(due)
		timer := time.NewTimer(0)
		defer timer.Stop()
		for tx := range txs {
			at := start.Add(time.Duration(tx) * every)
			if d := time.Until(at); d > 0 {
				timer.Reset(d)
				select {
				case <-ctx.Done():
					return
				case <-timer.C:
				}
			}
			if ld.EndAtDuration && time.Since(start) >= ld.Duration {
				return
			}
			select {
			case <-ctx.Done():
				return
			case due <- scheduled{tx, at}:
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, ld.Writers)
	var mu sync.Mutex
	committed := 0
	for range ld.Writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			evs := make([]outbox.Event, ld.TxEvents)
			for s := range due {
				if ld.OnLate != nil {
					ld.OnLate(max(0, time.Since(s.at)))
				}
				for j := range evs {
					evs[j] = outbox.Event{Topic: ld.Topic, AssetID: fmt.Sprintf("bench-asset-%d", (s.tx*ld.TxEvents+j)%ld.Assets),
						EventType: cmp.Or(ld.EventType, "bench.live"), Payload: []byte(`{"live":true}`)}
				}
				var ids []string
				began := time.Now()
				err := pgx.BeginFunc(ctx, pool, func(t pgx.Tx) error {
					got, err := outbox.EnqueueBatch(ctx, t, evs)
					for _, id := range got {
						ids = append(ids, id.String())
					}
					return err
				})
				if err != nil {
					errs <- fmt.Errorf("enqueue: %w", err)
					cancel()
					return
				}
				done := time.Now()
				onCommit(ids, done)
				if ld.OnTx != nil {
					ld.OnTx(began, done.Sub(began))
				}
				mu.Lock()
				committed += len(ids)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return 0, 0, err
	}
	if err := ctx.Err(); err != nil && !ld.EndAtDuration && committed < txs*ld.TxEvents {
		return 0, 0, err
	}
	return committed, float64(committed) / max(elapsed, ld.Duration).Seconds(), nil
}

// warmConnections opens up to n of pool's connections (at most its size),
// runs use on each (nil: a ping) and hands them back idle, so the writers'
// first transactions do not pay for a connection's start-up (TCP,
// authentication, a backend process) inside the measured schedule — nor,
// with an enqueue rolled back as use, for a new backend's first enqueue
// (the outbox's catalog entries loaded, its functions compiled, the
// statement prepared), which every writer would otherwise pay at the same
// moment, the schedule's start. Connections another user of the pool holds
// meanwhile are not waited for long: the warm-up is best effort.
func warmConnections(ctx context.Context, pool *pgxpool.Pool, n int, use func(context.Context, *pgxpool.Conn)) {
	n = min(n, int(pool.Config().MaxConns))
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conns := make([]*pgxpool.Conn, 0, n)
	for range n {
		c, err := pool.Acquire(wctx)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if use == nil {
				_ = c.Ping(wctx)
				return
			}
			use(wctx, c)
		}()
	}
	wg.Wait()
	for _, c := range conns {
		c.Release()
	}
}

// SustainWriters is the sustained load's default number of writers (the CLI
// sizes the bench's pool from it, so the two cannot drift apart).
const SustainWriters = 8

// SustainOptions configures Sustain.
type SustainOptions struct {
	Duration   time.Duration // default 10m
	Rate       int           // offered events/s (default 5000)
	Writers    int           // default SustainWriters
	TxEvents   int           // events per transaction (default 10)
	Assets     int           // default 1000
	Partitions int32         // default 6
	Replicas   int           // default 1
	// HoldXmin keeps a transaction with an xid open in another session for
	// the whole run, pinning the xmin horizon: vacuum cannot remove the
	// rows the relay marks, as with a long report or a forgotten session.
	HoldXmin bool
}

// SustainResult is what `bridge bench relay --sustain` prints.
type SustainResult struct {
	// Topics: the scratch topic the run made (deleted when it returns); not
	// part of the -o json output.
	Topics []string `json:"-"`

	DurationSeconds float64 `json:"duration_seconds"`
	OfferedRate     int     `json:"offered_rate"`
	AchievedRate    float64 `json:"achieved_rate"`
	Events          int     `json:"events"`
	Writers         int     `json:"writers"`
	TxEvents        int     `json:"tx_events"`
	Replicas        int     `json:"replicas"`
	BatchSize       int     `json:"batch_size"`
	HoldXmin        bool    `json:"hold_xmin"`
	LatencyP50Ms    float64 `json:"latency_p50_ms"`
	LatencyP99Ms    float64 `json:"latency_p99_ms"`
	LatencyMaxMs    float64 `json:"latency_max_ms"`
	// The claim statement's cost at the start and at the end of the run:
	// it must not grow.
	ClaimP99FirstMinuteMs float64 `json:"claim_p99_first_minute_ms"`
	ClaimP99LastMinuteMs  float64 `json:"claim_p99_last_minute_ms"`
	DeadTuplesAtEnd       int64   `json:"outbox_dead_tuples_at_end"`
	// Row writes to the outbox's tables (the log's and the held rows')
	// while the load ran, besides the events' inserts, per event committed
	// (pg_stat_user_tables), and the (auto)vacuums of them meanwhile.
	OutboxUpdatesPerEvent float64 `json:"outbox_updates_per_event"`
	OutboxDeletesPerEvent float64 `json:"outbox_deletes_per_event"`
	OutboxVacuums         int64   `json:"outbox_vacuums"`
	// The writers' transactions (BEGIN to COMMIT returned, EnqueueBatch of
	// TxEvents events): what the outbox costs the application.
	WriterTxP50Ms float64 `json:"writer_tx_p50_ms"`
	WriterTxP99Ms float64 `json:"writer_tx_p99_ms"`
	// The steps of commit→ack (see Result.LatencySteps).
	LatencySteps     Breakdown `json:"latency_steps"`
	LatencySlowSteps Breakdown `json:"latency_p99_steps"`
	// The same split by what the relay was doing (see Detail).
	LatencyDetail     Detail          `json:"latency_detail"`
	LatencySlowDetail Detail          `json:"latency_p99_detail"`
	Minutes           []SustainMinute `json:"minutes"`
}

// SustainMinute is one minute of a sustained run.
type SustainMinute struct {
	Minute       int     `json:"minute"`
	Acked        int     `json:"acked"`
	LatencyP99Ms float64 `json:"latency_p99_ms"`
	LatencyMaxMs float64 `json:"latency_max_ms"`
	Claims       int     `json:"claims"`
	ClaimP99Ms   float64 `json:"claim_p99_ms"`
	DeadTuples   int64   `json:"outbox_dead_tuples"`
	// Committed is how many events the writers committed in the minute,
	// WriterTxP99Ms their transactions' p99 (BEGIN to COMMIT returned).
	Committed     int     `json:"committed"`
	WriterTxP99Ms float64 `json:"writer_tx_p99_ms"`
	// WAL the whole cluster wrote in the minute (pg_stat_wal: the bench's
	// own in a quiet window), and how many of its records were full-page
	// images (a page's first change after a checkpoint).
	WALMiB            float64 `json:"wal_mib"`
	WALFullPageImages int64   `json:"wal_full_page_images"`
}

// Sustain offers a steady load for o.Duration with the relays running and
// reports commit→ack latency, the achieved rate and the claim's cost minute
// by minute.
func Sustain(ctx context.Context, pool *pgxpool.Pool, kafkaOpts []kgo.Opt, cfg relay.Config, o SustainOptions, progress func(string)) (*SustainResult, error) {
	cfg = cfg.WithDefaults()
	o.Duration = cmp.Or(o.Duration, 10*time.Minute)
	o.Rate = cmp.Or(o.Rate, 5000)
	o.Writers = cmp.Or(o.Writers, SustainWriters)
	o.TxEvents = cmp.Or(o.TxEvents, 10)
	o.Assets = cmp.Or(o.Assets, 1000)
	o.Partitions = cmp.Or(o.Partitions, 6)
	o.Replicas = cmp.Or(o.Replicas, 1)
	if progress == nil {
		progress = func(string) {}
	}
	res := &SustainResult{OfferedRate: o.Rate, Writers: o.Writers, TxEvents: o.TxEvents, Replicas: o.Replicas, BatchSize: cfg.BatchSize, HoldXmin: o.HoldXmin}

	lat := newLatencies()
	hook := &acks{lat: lat}
	adm, closeAdmin, err := scratchTopicAdmin(ctx, kafkaOpts, &res.Topics)
	if err != nil {
		return nil, err
	}
	defer closeAdmin() // registered before the producers: runs after they are closed
	var clients []*kgo.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for range o.Replicas {
		c, err := kgo.NewClient(append(slices.Clone(kafkaOpts), append(relay.ProducerOptions(cfg), kgo.WithHooks(hook))...)...)
		if err != nil {
			return nil, err
		}
		clients = append(clients, c)
	}
	topic := fmt.Sprintf("bridge-bench-sustain-%d", time.Now().UnixNano())
	if err := createTopic(ctx, adm, topic, o.Partitions); err != nil {
		return nil, err
	}
	res.Topics = append(res.Topics, topic)
	// Each relay's client learns the new topic's partitions before the load
	// starts: the first records to a topic just created wait for its
	// metadata and leaders (seconds after CreateTopic on this broker), a
	// one-off that a 1-minute run would otherwise report as its p99. The
	// warm-up records carry no dedup-id, so nothing counts them.
	for _, c := range clients {
		if err := warmUp(ctx, c, topic, []byte(`"warm-up"`)); err != nil {
			return nil, fmt.Errorf("warm up the bench topic: %w", err)
		}
	}

	if o.HoldXmin {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			conn.Release()
			return nil, err
		}
		var xid int64
		if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&xid); err != nil {
			_ = tx.Rollback(ctx)
			conn.Release()
			return nil, err
		}
		progress(fmt.Sprintf("holding transaction %d open for the whole run (pins the xmin horizon)", xid))
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)); conn.Release() }()
	}

	type claimAt struct {
		at time.Time
		ms float64
	}
	var cmu sync.Mutex
	var claims []claimAt
	rc := cfg
	rc.ClaimObserver = func(d time.Duration, _ int) {
		cmu.Lock()
		claims = append(claims, claimAt{time.Now(), float64(d.Microseconds()) / 1000})
		cmu.Unlock()
		lat.claimed(d)
	}
	rc.CycleObserver = lat.cycled
	runCtx, stop := context.WithCancel(ctx)
	var relays sync.WaitGroup
	var pools []*pgxpool.Pool
	defer func() {
		stop()
		relays.Wait()
		for _, p := range pools {
			p.Close()
		}
	}()
	for i, c := range clients {
		rc := rc
		rc.MemberID = ""
		rp := pool
		if i > 0 {
			var err error
			if rp, err = replicaPool(ctx, pool); err != nil {
				return nil, err
			}
			pools = append(pools, rp)
		}
		r := relay.New(rp, c, rc)
		relays.Add(1)
		go func() { defer relays.Done(); _ = r.Run(runCtx) }()
	}

	// Dead tuples once a minute, while the load runs.
	var dead []int64
	type walAt struct{ bytes, fpi int64 }
	readWAL := func() (w walAt) {
		_ = pool.QueryRow(ctx, `SELECT wal_bytes::bigint, wal_fpi FROM pg_stat_wal`).Scan(&w.bytes, &w.fpi)
		return w
	}
	wals := []walAt{readWAL()} // cluster-wide: the bench's own only in a quiet window
	sampleDone := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			select {
			case <-sampleDone:
				return
			case <-t.C:
				dead = append(dead, deadTuples(ctx, pool))
				wals = append(wals, readWAL())
			}
		}
	}()

	// What the database did meanwhile, with times, to set beside the relay's
	// "slow relay cycle" warnings and the slow acks below: a stall that
	// coincides with a checkpoint or an autovacuum of the outbox says where
	// to look.
	sampler.Add(1)
	go func() { defer sampler.Done(); watchDatabase(ctx, pool, sampleDone, progress) }()

	writesBefore, err := outboxstore.TableWrites(ctx, pool)
	if err != nil {
		return nil, err
	}
	progress(fmt.Sprintf("offering %d events/s for %s (%d writers, %d events per transaction)", o.Rate, o.Duration, o.Writers, o.TxEvents))
	start := time.Now()
	var tmu sync.Mutex
	var txs []claimAt // commit time, transaction ms
	onTx := func(began time.Time, took time.Duration) {
		tmu.Lock()
		txs = append(txs, claimAt{began.Add(took), float64(took.Microseconds()) / 1000})
		tmu.Unlock()
	}
	lr, err := offer(ctx, pool, Load{Topic: topic, Assets: o.Assets, Rate: o.Rate, Duration: o.Duration, Writers: o.Writers, TxEvents: o.TxEvents,
		EndAtDuration: true, OnTx: onTx}, lat)
	close(sampleDone)
	sampler.Wait()
	for _, e := range lat.slowEpisodes(slowAck) {
		progress(e)
	}
	if err != nil {
		return nil, err
	}
	if err := waitDrained(ctx, pool, topic, nil, 0); err != nil {
		return nil, err
	}
	res.DurationSeconds = time.Since(start).Seconds()
	res.Events, res.AchievedRate = lr.events, lr.achieved
	_, res.LatencyP50Ms, res.LatencyP99Ms, res.LatencyMaxMs = lat.summary()
	res.LatencySteps, res.LatencySlowSteps = lat.breakdown()
	res.LatencyDetail, res.LatencySlowDetail = lat.detail()
	writesAfter, err := settledWrites(ctx, pool)
	if err != nil {
		return nil, err
	}
	w := writesAfter.Sub(writesBefore)
	res.DeadTuplesAtEnd = w.Dead
	res.OutboxUpdatesPerEvent = float64(w.Updates) / float64(max(lr.events, 1))
	res.OutboxDeletesPerEvent = float64(w.Deletes) / float64(max(lr.events, 1))
	res.OutboxVacuums = w.Vacuums
	all := make([]float64, len(txs))
	for i, t := range txs {
		all[i] = t.ms
	}
	res.WriterTxP50Ms, res.WriterTxP99Ms = percentile(all, 0.5), percentile(all, 0.99)

	minutes := max(1, int(o.Duration/time.Minute))
	for m := range minutes {
		from, to := start.Add(time.Duration(m)*time.Minute), start.Add(time.Duration(m+1)*time.Minute)
		if m == minutes-1 {
			to = time.Now()
		}
		var ls, cs []float64
		lat.mu.Lock()
		for _, s := range lat.samples {
			if !s.at.Before(from) && s.at.Before(to) {
				ls = append(ls, float64(s.ms))
			}
		}
		lat.mu.Unlock()
		cmu.Lock()
		for _, c := range claims {
			if !c.at.Before(from) && c.at.Before(to) {
				cs = append(cs, c.ms)
			}
		}
		cmu.Unlock()
		var ws []float64
		tmu.Lock()
		for _, t := range txs {
			if !t.at.Before(from) && t.at.Before(to) {
				ws = append(ws, t.ms)
			}
		}
		tmu.Unlock()
		sm := SustainMinute{Minute: m + 1, Acked: len(ls), LatencyP99Ms: percentile(ls, 0.99), LatencyMaxMs: percentile(ls, 1), Claims: len(cs), ClaimP99Ms: percentile(cs, 0.99),
			Committed: len(ws) * o.TxEvents, WriterTxP99Ms: percentile(ws, 0.99)}
		if m < len(dead) {
			sm.DeadTuples = dead[m]
			sm.WALMiB = float64(wals[m+1].bytes-wals[m].bytes) / (1 << 20)
			sm.WALFullPageImages = wals[m+1].fpi - wals[m].fpi
		}
		res.Minutes = append(res.Minutes, sm)
	}
	res.ClaimP99FirstMinuteMs = res.Minutes[0].ClaimP99Ms
	res.ClaimP99LastMinuteMs = res.Minutes[len(res.Minutes)-1].ClaimP99Ms
	if lr.achieved < 0.98*float64(o.Rate) {
		return res, fmt.Errorf("%w: committed %.0f events/s of the %d offered", ErrShortOfRate, lr.achieved, o.Rate)
	}
	return res, nil
}

// ErrShortOfRate: the writers could not commit the offered rate, so the run
// does not measure the relay at that rate.
var ErrShortOfRate = errors.New("offered rate not reached")

func deadTuples(ctx context.Context, pool *pgxpool.Pool) int64 {
	w, _ := outboxstore.TableWrites(ctx, pool)
	return w.Dead
}

// slowAck: commit→ack above it is reported as part of an episode (the run's
// p99 target is 50 ms; an episode is what a stall looks like from outside).
const slowAck = 200 * time.Millisecond

// slowEpisodes describes the runs of acks slower than limit, by ack time
// (acks less than a second apart belong to one episode).
func (l *latencies) slowEpisodes(limit time.Duration) []string {
	l.mu.Lock()
	var slow []sample
	for _, s := range l.samples {
		if float64(s.ms) > float64(limit.Milliseconds()) {
			slow = append(slow, s)
		}
	}
	l.mu.Unlock()
	slices.SortFunc(slow, func(a, b sample) int { return a.at.Compare(b.at) })
	var out []string
	for i := 0; i < len(slow); {
		j, worst := i, slow[i].ms
		for j+1 < len(slow) && slow[j+1].at.Sub(slow[j].at) < time.Second {
			j++
			worst = max(worst, slow[j].ms)
		}
		out = append(out, fmt.Sprintf("slow acks: %d over %s acked %s–%s UTC, worst %.0f ms (committed ~%s)", j-i+1, limit,
			slow[i].at.UTC().Format("15:04:05.000"), slow[j].at.UTC().Format("15:04:05.000"), worst,
			slow[i].at.Add(-time.Duration(float64(worst)*float64(time.Millisecond))).UTC().Format("15:04:05.000")))
		i = j + 1
	}
	return out
}

// watchDatabase reports, once a second until done, autovacuum workers that
// start or finish on this database's tables and checkpoints that complete.
func watchDatabase(ctx context.Context, pool *pgxpool.Pool, done <-chan struct{}, progress func(string)) {
	const workersSQL = `SELECT pid, query, query_start FROM pg_stat_activity
WHERE backend_type = 'autovacuum worker' AND datname = current_database()`
	const checkpointsSQL = `SELECT checkpoints_timed + checkpoints_req, checkpoint_write_time, checkpoint_sync_time FROM pg_stat_bgwriter`
	type worker struct {
		query string
		since time.Time
	}
	running := map[int]worker{}
	var ckpts int64 = -1
	t := time.NewTicker(time.Second)
	defer t.Stop()
	stamp := func() string { return time.Now().UTC().Format("15:04:05") }
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		seen := map[int]bool{}
		rows, err := pool.Query(ctx, workersSQL)
		if err == nil {
			for rows.Next() {
				var pid int
				var q string
				var since *time.Time
				if rows.Scan(&pid, &q, &since) != nil {
					continue
				}
				seen[pid] = true
				if _, ok := running[pid]; !ok {
					w := worker{query: q}
					if since != nil {
						w.since = *since
					}
					running[pid] = w
					progress(fmt.Sprintf("%s database: %s (started %s)", stamp(), q, w.since.UTC().Format("15:04:05.000")))
				}
			}
			rows.Close()
		}
		for pid, w := range running {
			if !seen[pid] {
				delete(running, pid)
				progress(fmt.Sprintf("%s database: finished within a second: %s (%.1f s)", stamp(), w.query, time.Since(w.since).Seconds()))
			}
		}
		var n int64
		var write, sync float64
		if pool.QueryRow(ctx, checkpointsSQL).Scan(&n, &write, &sync) == nil {
			if ckpts >= 0 && n != ckpts {
				// PostgreSQL counts a checkpoint when it starts, and a spread
				// checkpoint then writes for minutes: saying "completed" here
				// put a checkpoint's end where its start (and the full-page
				// images that follow it) was.
				progress(fmt.Sprintf("%s database: checkpoint started (cluster totals of the completed ones: write %.1f s, sync %.1f s)", stamp(), write/1000, sync/1000))
			}
			ckpts = n
		}
	}
}
