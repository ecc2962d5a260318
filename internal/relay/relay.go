package relay

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/tracing"
)

// Config configures a Relay. Zero values take the defaults given.
type Config struct {
	// MaxAttempts is the number of failed sends charged to a row before it is
	// parked as FAILED. Default 10.
	MaxAttempts int
	// BackoffBase is the delay before the second attempt; it doubles with
	// each attempt up to BackoffMax. Default 7s (10 attempts span ~1 hour).
	BackoffBase time.Duration
	// BackoffMax caps one backoff delay. Default 30m.
	BackoffMax time.Duration
	// BatchSize is the number of rows claimed and produced per cycle. Default 1000.
	BatchSize int
	// PollInterval is the fallback poll when no NOTIFY arrives. Default 1s.
	PollInterval time.Duration
	// LeaseTimeout is the lane lease; a dead replica's lanes move after at
	// most this. Default 15s.
	LeaseTimeout time.Duration
	// ProduceTimeout bounds one produce attempt (franz-go would otherwise
	// retry a retriable error forever and the row would never be counted).
	// Default 30s.
	ProduceTimeout time.Duration
	// Retention: SENT rows older than this are deleted. Default 24h.
	Retention time.Duration
	// MaxMessageBytes: a payload larger than this is parked without sending.
	// Default 1000000.
	MaxMessageBytes int
	// MemberID identifies this replica in bridge.relay_lanes. Default: a new
	// random id per Relay (a restarted process never inherits a zombie's
	// leases).
	MemberID string
	// TracerProvider for the PRODUCER spans. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Metrics receives counters; nil records nothing.
	Metrics Metrics
	// Logger; default discards.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 10)
	c.BackoffBase = cmp.Or(c.BackoffBase, 7*time.Second)
	c.BackoffMax = cmp.Or(c.BackoffMax, 30*time.Minute)
	c.BatchSize = cmp.Or(c.BatchSize, 1000)
	c.PollInterval = cmp.Or(c.PollInterval, time.Second)
	c.LeaseTimeout = cmp.Or(c.LeaseTimeout, 15*time.Second)
	c.ProduceTimeout = cmp.Or(c.ProduceTimeout, 30*time.Second)
	c.Retention = cmp.Or(c.Retention, 24*time.Hour)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, 1000000)
	if c.MemberID == "" {
		host, _ := os.Hostname()
		c.MemberID = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Metrics == nil {
		c.Metrics = noMetrics{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Metrics is what the relay reports as it works (implemented by the
// observability package; see docs/observability.md).
type Metrics interface {
	// Produced counts rows acknowledged by the broker, with the
	// commit→ack latency of each.
	Produced(topic string, latency time.Duration)
	// AttemptCharged counts a failed send charged to a row.
	AttemptCharged(topic string)
	// Parked counts rows parked as FAILED, by reason (poison, exhausted).
	Parked(topic, reason string)
	// Outage reports whether the relay currently sees no reachable broker.
	Outage(active bool)
}

type noMetrics struct{}

func (noMetrics) Produced(string, time.Duration) {}
func (noMetrics) AttemptCharged(string)          {}
func (noMetrics) Parked(string, string)          {}
func (noMetrics) Outage(bool)                    {}

// ProducerOptions are the franz-go options the relay's client needs on top of
// the shared connection options (internal/kafkaclient).
func ProducerOptions(cfg Config) []kgo.Opt {
	cfg = cfg.withDefaults()
	return []kgo.Opt{
		// acks=all with the idempotent producer (franz-go's default, stated
		// here because the guarantee depends on it): a broker ack means the
		// record is replicated, and retries cannot reorder or duplicate
		// within a partition.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// Java-compatible murmur2 on the key, so a Java or librdkafka
		// (murmur2_random) producer of the same asset lands on the same
		// partition. The null asset has an empty, non-nil key: hashed like
		// any key, so its stream stays on one partition and in order.
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		// Bound each attempt: franz-go retries retriable errors forever by
		// default, and a send that never returns can never be counted
		// (docs/failure-modes.md §4).
		kgo.RecordDeliveryTimeout(cfg.ProduceTimeout),
		// Without this, franz-go refuses to fail a record already in flight
		// (it cannot tell "never received" from "written, reply lost") and
		// waits for the broker to come back: with every broker gone the
		// relay would hang inside produce, never see the outage, and not
		// drain on SIGTERM. The price is a possible duplicate when the
		// record is sent again — the same dedup-id, which consumers dedup on.
		kgo.AllowIdempotentProduceCancellation(),
		kgo.ProduceRequestTimeout(min(cfg.ProduceTimeout, 30*time.Second)),
		// The relay waits for a whole batch of acks per cycle; a short linger
		// keeps the commit→ack latency low without giving up batching.
		kgo.ProducerLinger(2 * time.Millisecond),
		kgo.ProducerBatchMaxBytes(int32(max(cfg.MaxMessageBytes+4096, 1<<20))),
		kgo.MaxBufferedRecords(max(cfg.BatchSize*2, 10000)),
		// Let the broker decide: where auto.create.topics.enable is on, the
		// first event of a new topic creates it instead of failing
		// UNKNOWN_TOPIC_OR_PARTITION until the row is parked. Where it is
		// off, the row is charged and parked as usual.
		kgo.AllowAutoTopicCreation(),
	}
}

// Relay moves NEW outbox rows to Kafka.
type Relay struct {
	pool   *pgxpool.Pool
	client *kgo.Client
	cfg    Config
	lanes  *laneKeeper
	tracer trace.Tracer
	log    *slog.Logger

	// cursor and lastFullScan are the claim's resume point (see claimSQL);
	// only the relay loop touches them.
	cursor       int64
	lastFullScan time.Time
	// unchargedRetryUsed: a batch where nothing got through while a broker
	// answered was already retried once without charging (see cycle).
	unchargedRetryUsed bool
	// noChargeUntil: retriable failures before this time (just after an
	// outage) are retried without charging the rows.
	noChargeUntil time.Time

	// testCrashAfterProduce, when set and returning true, makes the cycle stop
	// between produce and mark and Run return at once without releasing its
	// lanes: a process crash at the worst moment, for tests.
	testCrashAfterProduce func() bool
}

var errSimulatedCrash = errors.New("simulated crash")

// New returns a relay producing with client (built with ProducerOptions).
func New(pool *pgxpool.Pool, client *kgo.Client, cfg Config) *Relay {
	cfg = cfg.withDefaults()
	host, _ := os.Hostname()
	return &Relay{
		pool:   pool,
		client: client,
		cfg:    cfg,
		lanes:  newLaneKeeper(pool, cfg.MemberID, host, cfg.LeaseTimeout, cfg.Logger),
		tracer: cfg.TracerProvider.Tracer("github.com/outboxbridge/bridge/internal/relay"),
		log:    cfg.Logger,
	}
}

// MemberID is this replica's id in bridge.relay_lanes.
func (r *Relay) MemberID() string { return r.cfg.MemberID }

// OwnedLanes returns the lanes this replica holds now.
func (r *Relay) OwnedLanes() []int { return r.lanes.Owned() }

// Run relays until ctx is cancelled. On cancellation it stops claiming, waits
// for the acknowledgements of what is in flight, marks them, releases its
// lanes so other replicas take over at once, and returns nil.
func (r *Relay) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	bgCtx, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		stopBg()
		wg.Wait()
	}()

	if err := r.lanes.tick(ctx); err != nil {
		return err
	}
	wg.Add(3)
	go func() { defer wg.Done(); r.keepLanes(bgCtx) }()
	go func() { defer wg.Done(); r.listen(bgCtx, wake) }()
	go func() { defer wg.Done(); r.retain(bgCtx) }()

	r.log.InfoContext(ctx, "relay started", "member", r.cfg.MemberID, "lanes", len(r.lanes.Owned()), "batch_size", r.cfg.BatchSize)
	poll := time.NewTimer(0)
	defer poll.Stop()
	// The cycle and its settlement are not cancelled by ctx: once rows are
	// produced, their acks are awaited and marked even during shutdown.
	work := context.WithoutCancel(ctx)
	var inflight *settlement
	settle := func() {
		if inflight == nil {
			return
		}
		<-inflight.done
		if inflight.err != nil {
			// The rows stay NEW and go out again with the same dedup-id: at
			// least once, never lost.
			r.log.ErrorContext(ctx, "record relay outcomes", "error", inflight.err)
		}
		inflight = nil
	}
	defer settle()
	for {
		if r.lanes.hasSurplus() {
			// Lanes change hands only with nothing of theirs in flight.
			settle()
			r.lanes.releaseSurplus(ctx)
		}
		owned := r.lanes.Owned()
		full := false
		if len(owned) > 0 {
			res, next, err := r.cycle(work, owned, inflight)
			if errors.Is(err, errSimulatedCrash) {
				return err
			}
			settle()
			if next != nil {
				inflight = next
				go func(s *settlement) { s.err = s.write(work, r); close(s.done) }(next)
			}
			switch {
			case err != nil:
				r.log.ErrorContext(ctx, "relay cycle failed", "error", err)
			case res.outage:
				settle()
				if !r.waitForBroker(ctx) {
					return r.shutdown(ctx)
				}
				// The client's partitions recover one by one after an outage
				// (reconnects, a new producer epoch after cancelled records):
				// timeouts in the first produce attempts are the outage's tail,
				// not the rows' fault. Until a batch goes through cleanly (or
				// the window passes), retriable failures are not charged.
				r.noChargeUntil = time.Now().Add(5 * r.cfg.ProduceTimeout)
				continue
			default:
				full = res.claimed == r.cfg.BatchSize
			}
		}
		if !full {
			settle()
		}
		if ctx.Err() != nil {
			settle()
			return r.shutdown(ctx)
		}
		if full {
			continue // more is waiting: no need to wait for a NOTIFY
		}
		poll.Reset(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
			return r.shutdown(ctx)
		case <-wake:
		case <-r.lanes.changed:
		case <-poll.C:
		}
	}
}

func (r *Relay) shutdown(runCtx context.Context) error {
	if errors.Is(context.Cause(runCtx), errSimulatedCrash) {
		return errSimulatedCrash // a dead process releases nothing
	}
	ctx, cancel := context.WithTimeout(context.Background(), database.QueryTimeout)
	defer cancel()
	r.lanes.releaseAll(ctx)
	r.log.InfoContext(ctx, "relay stopped", "member", r.cfg.MemberID)
	return nil
}

func (r *Relay) keepLanes(ctx context.Context) {
	// Renew well within the lease so one slow round trip does not lose it.
	r.every(ctx, max(r.cfg.LeaseTimeout/5, 100*time.Millisecond), "lane lease upkeep failed", r.lanes.tick)
}

// every runs job on a ticker until ctx ends; a failure is logged as what
// and the loop goes on (context.Canceled at shutdown is not a failure).
func (r *Relay) every(ctx context.Context, interval time.Duration, what string, job func(context.Context) error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := job(ctx); err != nil && ctx.Err() == nil {
				r.log.WarnContext(ctx, what, "error", err)
			}
		}
	}
}

// listen wakes the loop on NOTIFY bridge_outbox (sent by a trigger at
// commit), so an event is produced within milliseconds of its commit; the
// poll interval is only the fallback when the listener is reconnecting.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	for ctx.Err() == nil {
		err := func() error {
			pooled, err := r.pool.Acquire(ctx)
			if err != nil {
				return err
			}
			// The connection carries LISTEN state: take it out of the pool for
			// good, and close it when done.
			conn := pooled.Hijack()
			defer conn.Close(context.Background())
			if _, err := conn.Exec(ctx, `LISTEN bridge_outbox`); err != nil {
				return err
			}
			for {
				if _, err := conn.WaitForNotification(ctx); err != nil {
					return err
				}
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		}()
		if ctx.Err() != nil {
			return
		}
		r.log.WarnContext(ctx, "outbox listener reconnecting", "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// retain deletes SENT rows past the retention in bounded batches.
func (r *Relay) retain(ctx context.Context) {
	r.every(ctx, min(max(r.cfg.Retention/10, time.Second), time.Minute), "outbox retention failed", func(ctx context.Context) error {
		_, err := DeleteSent(ctx, r.pool, r.cfg.Retention)
		return err
	})
}

// DeleteSent deletes SENT rows older than retention, 5000 at a time, and
// returns how many it removed.
func DeleteSent(ctx context.Context, pool *pgxpool.Pool, retention time.Duration) (int64, error) {
	const chunk = 5000
	var total int64
	for {
		qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
		tag, err := pool.Exec(qctx, deleteSentSQL, interval(retention), chunk)
		cancel()
		if err != nil {
			return total, fmt.Errorf("delete sent outbox rows: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < chunk {
			return total, nil
		}
	}
}

// waitForBroker backs off while no broker answers, probing until one does.
// Nothing is charged meanwhile: an outage is not any row's fault.
func (r *Relay) waitForBroker(ctx context.Context) bool {
	r.cfg.Metrics.Outage(true)
	defer r.cfg.Metrics.Outage(false)
	delay := 250 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(delay):
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := r.client.Ping(pctx)
		cancel()
		if err == nil {
			r.log.InfoContext(ctx, "broker reachable again; resuming")
			return true
		}
		r.log.WarnContext(ctx, "broker unreachable; waiting (no attempts charged)", "error", err, "retry_in", delay)
		delay = min(delay*2, 5*time.Second)
	}
}

// row is one claimed outbox row.
type row struct {
	id          uuid.UUID
	seq         int64
	assetSeq    int64
	topic       string
	assetID     *string
	lane        int
	eventType   string
	payload     string
	headers     map[string]string
	traceparent string
	tracestate  string
	attempts    int
	createdAt   time.Time
	replayed    bool
}

func (w *row) assetKey() string {
	if w.assetID == nil {
		return ""
	}
	return *w.assetID
}

type cycleResult struct {
	claimed int
	outage  bool
}

// sendResult is the outcome of producing one row.
type sendResult struct {
	partition int32
	offset    int64
	err       error
}

// claim reads the next batch. See claimSQL for the cursor: the claim
// resumes after the last row it claimed while a drain is under way, and scans
// from the start whenever it caught up or the poll interval passed.
func (r *Relay) claim(ctx context.Context, lanes []int, exclude []int64) ([]*row, error) {
	qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	if exclude == nil {
		exclude = []int64{}
	}
	cursor := r.cursor
	if time.Since(r.lastFullScan) >= r.cfg.PollInterval {
		cursor = 0
	}
	if cursor == 0 {
		r.lastFullScan = time.Now()
	}
	rows, err := r.pool.Query(qctx, claimSQL, lanes, r.cfg.BatchSize, exclude, cursor, r.cfg.MemberID, interval(r.cfg.LeaseTimeout/2))
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, func(rs pgx.CollectableRow) (*row, error) {
		var w row
		var hdr []byte
		err := rs.Scan(&w.id, &w.seq, &w.assetSeq, &w.topic, &w.assetID, &w.lane, &w.eventType, &w.payload,
			&hdr, &w.traceparent, &w.tracestate, &w.attempts, &w.createdAt, &w.replayed)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(hdr, &w.headers); err != nil {
			return nil, fmt.Errorf("outbox row %s: headers: %w", w.id, err)
		}
		return &w, nil
	})
	if err != nil {
		return nil, err
	}
	if len(claimed) < r.cfg.BatchSize {
		r.cursor = 0 // caught up: the next claim scans from the start
	} else {
		r.cursor = claimed[len(claimed)-1].seq
	}
	return claimed, nil
}

// cycle claims one batch, produces it, waits for every ack and records the
// outcome of each row.
// settlement is the bookkeeping of one produced batch: which rows to mark
// SENT, park or charge. It is written while the next batch is claimed and
// produced (the marks are the slowest step of a cycle), at most one at a time.
type settlement struct {
	rows      []*row
	results   []sendResult
	sent      []int
	park      []int
	charge    []int
	oversized []int
	// seqs of every row of the batch: they are still NEW until the
	// settlement is written, so the next claim must skip them.
	seqs []int64
	// unsettled holds the assets with a failed row in the batch. Their hold
	// (next_attempt_at) is not written yet, so the next batch must not carry
	// their later rows.
	unsettled map[string]bool
	done      chan struct{}
	err       error
}

// write records the outcomes. Marks are fenced by the lane lease.
func (s *settlement) write(ctx context.Context, r *Relay) error {
	if err := r.markSent(ctx, s.rows, s.sent, s.results); err != nil {
		return err
	}
	if len(s.park)+len(s.oversized) > 0 {
		reasons := map[int]string{}
		for _, i := range s.park {
			reasons[i] = fmt.Sprintf("not retriable (record of %d bytes): %v", len(s.rows[i].payload), s.results[i].err)
		}
		for _, i := range s.oversized {
			reasons[i] = tooLargeReason(s.rows[i], r.cfg.MaxMessageBytes)
		}
		r.park(ctx, s.rows, append(slices.Clone(s.park), s.oversized...), func(i int) string { return reasons[i] })
	}
	if len(s.charge) > 0 {
		return r.charge(ctx, s.rows, s.charge, s.results)
	}
	return nil
}

// cycle claims one batch (skipping what the settlement still being written
// covers), produces it, waits for every ack and judges each failure. It
// returns the settlement to write; nil when nothing was claimed.
func (r *Relay) cycle(ctx context.Context, lanes []int, inflight *settlement) (cycleResult, *settlement, error) {
	started := time.Now()
	var exclude []int64
	if inflight != nil {
		exclude = inflight.seqs
	}
	claimed, err := r.claim(ctx, lanes, exclude)
	if err != nil || len(claimed) == 0 {
		return cycleResult{}, nil, err
	}
	claimedAt := time.Now()
	res := cycleResult{claimed: len(claimed)}
	if inflight != nil && len(inflight.unsettled) > 0 {
		claimed = slices.DeleteFunc(claimed, func(w *row) bool { return inflight.unsettled[w.assetKey()] })
	}
	if claimed, err = r.inOrder(ctx, claimed, inflight); err != nil {
		return res, nil, err
	}
	if len(claimed) == 0 {
		return res, nil, nil
	}
	rows := sameTopicRuns(claimed)

	s := &settlement{rows: rows, results: make([]sendResult, len(rows)), unsettled: map[string]bool{}, done: make(chan struct{})}
	results := s.results
	var toSend []int
	for i, w := range rows {
		s.seqs = append(s.seqs, w.seq)
		if len(w.payload) > r.cfg.MaxMessageBytes {
			s.oversized = append(s.oversized, i)
			continue
		}
		toSend = append(toSend, i)
	}
	r.produce(ctx, rows, toSend, results)
	r.log.DebugContext(ctx, "relay cycle", "rows", len(rows), "claim", claimedAt.Sub(started), "produce", time.Since(claimedAt))
	if r.testCrashAfterProduce != nil && r.testCrashAfterProduce() {
		return res, nil, errSimulatedCrash
	}

	var failed []int
	for _, i := range toSend {
		if results[i].err == nil {
			s.sent = append(s.sent, i)
		} else {
			failed = append(failed, i)
			s.unsettled[rows[i].assetKey()] = true
		}
	}

	// Outage or poison (docs/failure-modes.md §4)? When nothing in the batch got through,
	// ask whether any broker answers at all. If none does, this is an outage:
	// charge nothing, back off, probe, resume.
	if len(s.sent) == 0 && len(failed) > 0 && allRetriable(results, failed) {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		pingErr := r.client.Ping(pctx)
		cancel()
		if pingErr != nil {
			r.log.WarnContext(ctx, "no broker reachable: treating as outage, no attempts charged",
				"rows", len(failed), "error", results[failed[0]].err, "ping_error", pingErr)
			res.outage = true
			return res, &settlement{rows: rows, results: results, oversized: s.oversized, seqs: s.seqs, done: s.done}, nil
		}
		if !r.unchargedRetryUsed {
			// A broker that answers now may have been down while these
			// records were in flight (an outage ending mid-batch). Retry once
			// without charging; if the next batch fails the same way with
			// the broker up, the failures are the rows' own.
			r.unchargedRetryUsed = true
			r.log.WarnContext(ctx, "nothing in the batch got through but a broker answers; retrying once before charging",
				"rows", len(failed), "error", results[failed[0]].err)
			return res, &settlement{rows: rows, results: results, oversized: s.oversized, seqs: s.seqs, done: s.done}, nil
		}
	}
	if len(s.sent) > 0 {
		r.unchargedRetryUsed = false
	}
	if len(failed) == 0 {
		r.noChargeUntil = time.Time{} // a clean batch: the outage is over
	}

	// Only the earliest failed row of each asset is judged. franz-go fails
	// all buffered records of a partition together, so the later rows of the
	// same asset are collateral: they stay NEW, uncharged, held behind their
	// head by the claim's per-asset hold.
	heads := map[string]bool{}
	for _, i := range failed { // failed is in seq order
		k := rows[i].assetKey()
		if heads[k] {
			continue
		}
		heads[k] = true
		switch classify(results[i].err) {
		case poison:
			s.park = append(s.park, i)
		case suspect:
			// The broker rejects a whole batch for one bad record: re-send
			// this row alone before judging it.
			results[i] = r.produceAlone(ctx, rows[i])
			switch {
			case results[i].err == nil:
				s.sent = append(s.sent, i)
			case classify(results[i].err) == retriable:
				s.charge = append(s.charge, i)
			default:
				s.park = append(s.park, i)
			}
		default:
			if time.Now().Before(r.noChargeUntil) {
				continue // just after an outage: the failure is the outage's tail
			}
			s.charge = append(s.charge, i)
		}
	}
	return res, s, nil
}

// inOrder keeps, per asset, only the claimed rows that can go out now: the
// asset's first claimed row must follow an event that is no longer NEW (or
// was acked in the batch whose outcome is being written), and the rows after
// it must continue its asset_seq without a gap. Rows it drops stay NEW and are
// claimed again by a later cycle, in order. This is what makes the claim's
// resume cursor safe (see claimSQL).
func (r *Relay) inOrder(ctx context.Context, claimed []*row, inflight *settlement) ([]*row, error) {
	first := map[string]int64{}
	var keys []string
	var seqs []int64
	for _, w := range claimed {
		k := w.assetKey()
		if _, ok := first[k]; ok {
			continue
		}
		first[k] = w.assetSeq
		if w.assetSeq > 1 {
			keys = append(keys, k)
			seqs = append(seqs, w.assetSeq-1)
		}
	}
	acked := map[string]int64{} // asset → highest asset_seq acked in flight
	if inflight != nil {
		for _, i := range inflight.sent {
			w := inflight.rows[i]
			acked[w.assetKey()] = max(acked[w.assetKey()], w.assetSeq)
		}
	}
	blocked := map[string]bool{}
	if len(keys) > 0 {
		qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
		defer cancel()
		rs, err := r.pool.Query(qctx, predecessorsSQL, keys, seqs)
		if err != nil {
			return nil, fmt.Errorf("check predecessors: %w", err)
		}
		for rs.Next() {
			var k, status string
			if err := rs.Scan(&k, &status); err != nil {
				rs.Close()
				return nil, fmt.Errorf("check predecessors: %w", err)
			}
			if status == "NEW" && acked[k] != first[k]-1 {
				blocked[k] = true
			}
		}
		rs.Close()
		if err := rs.Err(); err != nil {
			return nil, fmt.Errorf("check predecessors: %w", err)
		}
	}
	next := map[string]int64{}
	out := claimed[:0:0]
	for _, w := range claimed {
		k := w.assetKey()
		if blocked[k] {
			continue
		}
		if want, ok := next[k]; ok && w.assetSeq != want {
			blocked[k] = true // a gap: the missing row was not claimed
			continue
		}
		next[k] = w.assetSeq + 1
		out = append(out, w)
	}
	return out, nil
}

// sameTopicRuns keeps, per asset, only the leading rows that go to the same
// topic as the asset's first row in the batch. Records of one asset to one
// topic share a partition, and franz-go fails a partition's buffered records
// together, so a failure there cannot be overtaken. Records to another topic
// would be produced concurrently and could land while an earlier row of the
// asset is failing; they wait for the next cycle instead.
func sameTopicRuns(rows []*row) []*row {
	topicOf := map[string]string{}
	stopped := map[string]bool{}
	out := rows[:0:0]
	for _, w := range rows {
		k := w.assetKey()
		if stopped[k] {
			continue
		}
		if t, seen := topicOf[k]; seen && t != w.topic {
			stopped[k] = true
			continue
		}
		topicOf[k] = w.topic
		out = append(out, w)
	}
	return out
}

func tooLargeReason(w *row, limit int) string {
	return fmt.Sprintf("payload is %d bytes, over RELAY_MAX_MESSAGE_BYTES=%d", len(w.payload), limit)
}

func allRetriable(results []sendResult, idx []int) bool {
	for _, i := range idx {
		if classify(results[i].err) != retriable {
			return false
		}
	}
	return true
}

// record builds the Kafka record for w (docs/contract.md, "Kafka record")
// under the span context in ctx, which it carries into the producer's hooks.
func record(ctx context.Context, w *row) *kgo.Record {
	tp, ts := tracing.Traceparent(ctx)
	rec := contract.Encode(contract.Event{
		DedupID: w.id.String(), Topic: w.topic, AssetID: w.assetID, AssetSeq: w.assetSeq,
		EventType: w.eventType, Payload: []byte(w.payload), Headers: w.headers,
		TraceID: tracing.TraceID(ctx), Traceparent: tp, Tracestate: ts,
	})
	rec.Context = ctx
	return rec
}

// startSpan starts the PRODUCER span of one row, parented on the trace
// context stored with the row (the application's request), so the record
// continues that trace. A replayed row stays in its original trace.
func (r *Relay) startSpan(ctx context.Context, w *row) (context.Context, trace.Span) {
	parent := tracing.ContextWithRemoteParent(ctx, w.traceparent, w.tracestate)
	ctx, span := r.tracer.Start(parent, "publish "+w.topic,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", w.topic),
			attribute.String("messaging.message.id", w.id.String()),
			attribute.String("messaging.kafka.message.key", w.assetKey()),
			attribute.String("outbox.event_type", w.eventType),
			attribute.Int64("outbox.asset_seq", w.assetSeq),
			attribute.Int("outbox.attempt", w.attempts+1),
			attribute.Bool("outbox.replayed", w.replayed),
		))
	if !span.SpanContext().IsValid() {
		// No SDK: the stored context must still travel in the headers.
		return parent, span
	}
	return ctx, span
}

func endSpan(span trace.Span, res sendResult) {
	if res.err != nil {
		span.RecordError(res.err)
		span.SetStatus(codes.Error, res.err.Error())
	} else {
		span.SetAttributes(
			attribute.Int("messaging.destination.partition.id", int(res.partition)),
			attribute.Int64("messaging.kafka.offset", res.offset))
	}
	span.End()
}

// produce sends rows[idx...] and waits for every acknowledgement.
func (r *Relay) produce(ctx context.Context, rows []*row, idx []int, results []sendResult) {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.ProduceTimeout+5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(len(idx))
	for _, i := range idx {
		w := rows[i]
		sctx, span := r.startSpan(pctx, w)
		rec := record(sctx, w)
		r.client.Produce(pctx, rec, func(rec *kgo.Record, err error) {
			defer wg.Done()
			results[i] = sendResult{partition: rec.Partition, offset: rec.Offset, err: err}
			endSpan(span, results[i])
		})
	}
	wg.Wait()
}

func (r *Relay) produceAlone(ctx context.Context, w *row) sendResult {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.ProduceTimeout+5*time.Second)
	defer cancel()
	sctx, span := r.startSpan(pctx, w)
	span.SetAttributes(attribute.Bool("outbox.resent_alone", true))
	rec := record(sctx, w)
	res := r.client.ProduceSync(pctx, rec)
	out := sendResult{partition: rec.Partition, offset: rec.Offset, err: res.FirstErr()}
	endSpan(span, out)
	return out
}

func (r *Relay) markSent(ctx context.Context, rows []*row, idx []int, results []sendResult) error {
	if len(idx) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, len(idx))
	parts := make([]int32, len(idx))
	offs := make([]int64, len(idx))
	for j, i := range idx {
		ids[j], parts[j], offs[j] = rows[i].id, results[i].partition, results[i].offset
	}
	qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	tag, err := r.pool.Exec(qctx, markSentSQL, r.cfg.MemberID, ids, parts, offs)
	if err != nil {
		// The rows stay NEW and will be produced again with the same
		// dedup-id: at least once, never lost.
		return fmt.Errorf("mark outbox rows sent: %w", err)
	}
	if n := tag.RowsAffected(); n < int64(len(idx)) {
		r.log.WarnContext(ctx, "lane lease lost while rows were in flight; another replica will mark them",
			"acked", len(idx), "marked", n)
	}
	now := time.Now()
	for _, i := range idx {
		r.cfg.Metrics.Produced(rows[i].topic, now.Sub(rows[i].createdAt))
	}
	return nil
}

// backoff returns the delay before the attempt after `attempts` failures:
// BackoffBase·2^(attempts-1), capped, with ±10% jitter so rows that failed
// together do not retry in lockstep.
func (r *Relay) backoff(attempts int) time.Duration {
	d := r.cfg.BackoffBase
	for i := 1; i < attempts && d < r.cfg.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, r.cfg.BackoffMax)
	jitter := time.Duration((rand.Float64()*0.2 - 0.1) * float64(d))
	return d + jitter
}

func (r *Relay) charge(ctx context.Context, rows []*row, idx []int, results []sendResult) error {
	ids := make([]uuid.UUID, len(idx))
	errs := make([]string, len(idx))
	delays := make([]int64, len(idx))
	for j, i := range idx {
		ids[j] = rows[i].id
		errs[j] = results[i].err.Error()
		delays[j] = r.backoff(rows[i].attempts + 1).Milliseconds()
	}
	qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	out, err := r.pool.Query(qctx, chargeSQL, r.cfg.MemberID, ids, errs, delays, r.cfg.MaxAttempts)
	if err != nil {
		return fmt.Errorf("charge outbox attempts: %w", err)
	}
	byID := map[uuid.UUID]*row{}
	for _, i := range idx {
		byID[rows[i].id] = rows[i]
	}
	for out.Next() {
		var id uuid.UUID
		var status string
		var attempts int
		if err := out.Scan(&id, &status, &attempts); err != nil {
			out.Close()
			return fmt.Errorf("charge outbox attempts: %w", err)
		}
		w := byID[id]
		r.cfg.Metrics.AttemptCharged(w.topic)
		lctx := tracing.ContextWithRemoteParent(ctx, w.traceparent, w.tracestate)
		if status == "FAILED" {
			r.cfg.Metrics.Parked(w.topic, "exhausted")
			r.spanEvent(lctx, w, "outbox.parked", "attempts exhausted")
			r.log.ErrorContext(lctx, "outbox row parked as FAILED after its last attempt",
				"dedup_id", id, "topic", w.topic, "asset_id", w.assetKey(), "attempts", attempts, "error", errs[slices.Index(ids, id)])
		} else {
			r.log.WarnContext(lctx, "produce failed; will retry",
				"dedup_id", id, "topic", w.topic, "asset_id", w.assetKey(), "attempts", attempts, "error", errs[slices.Index(ids, id)])
		}
	}
	out.Close()
	return out.Err()
}

func (r *Relay) park(ctx context.Context, rows []*row, idx []int, reason func(i int) string) {
	ids := make([]uuid.UUID, len(idx))
	reasons := make([]string, len(idx))
	for j, i := range idx {
		ids[j], reasons[j] = rows[i].id, reason(i)
	}
	qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	if _, err := r.pool.Exec(qctx, parkSQL, r.cfg.MemberID, ids, reasons); err != nil {
		r.log.ErrorContext(ctx, "park outbox rows", "error", err)
		return
	}
	for j, i := range idx {
		w := rows[i]
		lctx := tracing.ContextWithRemoteParent(ctx, w.traceparent, w.tracestate)
		r.cfg.Metrics.Parked(w.topic, "poison")
		r.spanEvent(lctx, w, "outbox.parked", reasons[j])
		r.log.ErrorContext(lctx, "outbox row parked as FAILED: retrying cannot fix it",
			"dedup_id", w.id, "topic", w.topic, "asset_id", w.assetKey(), "reason", reasons[j])
	}
}

// spanEvent records a parked row in its trace: a short span with an event,
// so the trace in Jaeger shows where the event stopped.
func (r *Relay) spanEvent(ctx context.Context, w *row, name, reason string) {
	_, span := r.tracer.Start(ctx, "park "+w.topic, trace.WithAttributes(
		attribute.String("messaging.message.id", w.id.String())))
	span.AddEvent(name, trace.WithAttributes(attribute.String("reason", reason)))
	span.SetStatus(codes.Error, reason)
	span.End()
}
