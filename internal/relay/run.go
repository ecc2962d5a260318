package relay

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/service"
)

// The run loop: leases, NOTIFY wake-ups, retention, outage back-off and
// graceful shutdown around the cycle.

// Relay moves NEW outbox rows to Kafka.
type Relay struct {
	pool   *pgxpool.Pool
	client *kgo.Client
	cfg    Config
	lanes  *laneKeeper
	tracer trace.Tracer
	log    *slog.Logger

	// groups are the owned lanes by position, with the batch each is
	// reading; known is the last asset_seq produced per asset; savedAt is
	// when positions were last handed to a settlement. Only the relay loop
	// touches them.
	groups  []*laneGroup
	known   map[string]int64
	savedAt time.Time
	// server: the start time of the PostgreSQL server the last read came
	// from ("" before the first); see forgetPositions.
	server string
	// prefetched: the next claim's read, running or done (nil: none).
	prefetched *prefetch
	// wake tells the writers whether this relay needs their notifications.
	wake *wakeState
	// fenceWarned: when the claim last warned that the leases were late.
	fenceWarned time.Time
	// unchargedRetryUsed: a batch where nothing got through while a broker
	// answered was already retried once without charging (see cycle).
	unchargedRetryUsed bool
	// noChargeUntil: retriable failures before this time (just after an
	// outage) are retried without charging the rows.
	noChargeUntil time.Time
	// rowsAt: when a claim last found rows (see trickle).
	rowsAt time.Time

	// testCrashAfterProduce, when set and returning true, makes the cycle stop
	// between produce and mark and Run return at once without releasing its
	// lanes: a process crash at the worst moment, for tests.
	testCrashAfterProduce func() bool
}

var errSimulatedCrash = errors.New("simulated crash")

// New returns a relay producing with client (built with ProducerOptions).
func New(pool *pgxpool.Pool, client *kgo.Client, cfg Config) *Relay {
	cfg = cfg.WithDefaults()
	host, _ := os.Hostname()
	r := &Relay{
		pool:   pool,
		client: client,
		cfg:    cfg,
		lanes:  newLaneKeeper(pool, cfg.MemberID, host, cfg.LeaseTimeout, cfg.Logger),
		tracer: cfg.TracerProvider.Tracer("github.com/outboxbridge/bridge/internal/relay"),
		log:    cfg.Logger,
		known:  map[string]int64{},
	}
	r.wake = newWakeState(pool, cfg.Logger, min(cfg.PollInterval, wakeGateTimeout))
	return r
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

	// The first lease tick retries like every later one: a relay started
	// while PostgreSQL is briefly down (a restart, a failover) waits for it
	// instead of exiting with "relay heartbeat: failed to connect" and
	// leaving its restart to a supervisor.
	if err := service.Retry(ctx, service.Wait{Name: "relay's first lane lease tick", Logger: r.log}, r.lanes.tick); err != nil {
		if ctx.Err() != nil {
			return r.shutdown(ctx)
		}
		return err
	}
	wg.Add(4)
	go func() { defer wg.Done(); r.keepLanes(bgCtx) }()
	go func() { defer wg.Done(); r.listenLanes(bgCtx) }()
	go func() { defer wg.Done(); r.listen(bgCtx, wake) }()
	go func() {
		defer wg.Done()
		(&Rotation{Pool: r.pool, Retention: r.cfg.Retention, Logger: r.log}).Run(bgCtx)
	}()

	r.log.InfoContext(ctx, "relay started", "member", r.cfg.MemberID, "lanes", len(r.lanes.Owned()), "batch_size", r.cfg.BatchSize)
	poll := time.NewTimer(0)
	defer poll.Stop()
	// The cycle and its settlement are not cancelled by ctx: once rows are
	// produced, their acks are awaited and marked even during shutdown.
	work := context.WithoutCancel(ctx)
	var inflight *settlement
	var failedOutcomes bool // a settlement could not be written: the next one saves no position
	var idleFrom time.Time  // when the loop began waiting for work (zero: it did not)
	settle := func() {
		if inflight == nil {
			return
		}
		<-inflight.done
		if inflight.err != nil {
			// The lanes read the batch again from before it, and what went
			// out goes out again with the same dedup-id: at least once,
			// never lost.
			r.log.ErrorContext(ctx, "record relay outcomes", "error", inflight.err)
			r.restore(inflight.before)
			failedOutcomes = true
		}
		inflight = nil
	}
	defer settle()
	for {
		if r.lanes.hasSurplus() {
			// Lanes change hands only with nothing of theirs in flight, at
			// the position this replica reached.
			settle()
			r.savePositionsNow(ctx)
			r.lanes.releaseSurplus(ctx)
		}
		owned := r.lanes.Owned()
		full, found, claimed := false, false, 0
		if len(owned) > 0 {
			cycleStarted := time.Now()
			res, next, err := r.cycle(work, owned, inflight)
			if errors.Is(err, errSimulatedCrash) {
				r.wake.close() // a dead process's connections close
				return err
			}
			prev, waitStarted := inflight, time.Now()
			settle()
			r.reportSlowCycle(ctx, cycleStarted, waitStarted, res, prev)
			if obs := r.cfg.CycleObserver; obs != nil {
				obs(CycleTimes{IdleFrom: idleFrom, ClaimStart: cycleStarted, ClaimEnd: cycleStarted.Add(res.claimTook),
					Produced: res.produced, Acked: res.acked, Settled: time.Now(), Rows: res.claimed})
			}
			idleFrom = time.Time{}
			if next != nil && failedOutcomes {
				// It was read past what the failed settlement left
				// unwritten: its outcomes stand, its positions do not.
				next.save = nil
				failedOutcomes = false
			}
			if next != nil {
				inflight = next
				go func(s *settlement) {
					started := time.Now()
					s.err = s.write(work, r)
					s.took = time.Since(started)
					close(s.done)
				}(next)
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
				full, found, claimed = res.more, next != nil, res.claimed
			}
		}
		if ctx.Err() != nil {
			settle()
			return r.shutdown(ctx)
		}
		steady := r.trickle(claimed, time.Now())
		if full || (found && claimed >= busyFromRows) {
			// More is waiting, or rows went out under a load that keeps
			// more committing: claim again at once, no need to wait for a
			// NOTIFY. While this relay does, commits skip their
			// notification (see wakeState): notifying commits wait for one
			// another, WAL flush included.
			r.wake.busy(ctx)
			continue
		}
		if steady {
			// A steady trickle of small commits: claim again after a pause
			// of busyPause, with commits skipping their notification, as
			// long as rows keep coming (see trickle).
			r.wake.busy(ctx)
			if idleFrom.IsZero() {
				idleFrom = time.Now()
			}
			if !r.pause(ctx, wake, busyPause) {
				settle()
				return r.shutdown(ctx)
			}
			continue
		}
		if !r.wake.readyToBlock() {
			// Nothing went out. Say so to the writers and wait for the
			// commits that skipped their notification to be visible; the
			// claim after that sees all of them.
			r.wake.wait(ctx)
			continue
		}
		// Wait for the next NOTIFY while the last batch's marks are still
		// being written, as a drain's next claim does: an event that
		// commits meanwhile is claimed at once, next to the settlement
		// (the claim skips its rows, see settlement.excluded). Waiting for
		// the marks first added a whole mark — a commit that queues for
		// the WAL flush behind the writers' — to the commit→ack latency of
		// every event committed while it ran.
		poll.Reset(r.cfg.PollInterval)
		if idleFrom.IsZero() {
			idleFrom = time.Now()
		}
		if !r.waitForWork(ctx, wake, poll.C, &inflight, settle) {
			settle() // marks are fenced by the leases: written before they are released
			return r.shutdown(ctx)
		}
	}
}

// busyFromRows: a claim that finds at least this many rows makes the relay
// claim again at once (no pause): at 5,000 events/s in transactions of 10
// claims find 25–100 rows, and more are committing. Smaller claims keep it
// busy only under the trickle rule (see trickle), which pauses busyPause
// between claims.
const busyFromRows = 16

// The trickle rule: a relay that found rows within busyWindow of the rows
// before them is under a steady load of small commits. Waiting for a NOTIFY
// after each of its claims made every event of that load pay for the
// notification (notifying commits queue for one another, WAL flush
// included, so the writers fell behind the rate offered), for the wake-up,
// and for the gate and last claim of going to wait; so it stays busy —
// commits skip their notification, and it claims again after busyPause —
// until busyLinger passes with no row found, then goes to wait as before.
// A lone commit (nothing found within busyWindow before it) still takes the
// NOTIFY path, and an idle relay claims nothing between notifications.
const (
	busyWindow = 50 * time.Millisecond
	busyLinger = 20 * time.Millisecond
	busyPause  = time.Millisecond
)

// trickle records a claim that found claimed rows at now and reports
// whether the relay stays busy after it under the trickle rule.
func (r *Relay) trickle(claimed int, now time.Time) bool {
	if claimed > 0 {
		steady := !r.rowsAt.IsZero() && now.Sub(r.rowsAt) <= busyWindow
		r.rowsAt = now
		return steady || r.wake.isBusy()
	}
	return r.wake.isBusy() && !r.rowsAt.IsZero() && now.Sub(r.rowsAt) < busyLinger
}

// pause waits d (or less, if a NOTIFY or a change of lanes comes first);
// it returns false when ctx is done.
func (r *Relay) pause(ctx context.Context, wake <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-wake:
	case <-r.lanes.changed:
	case <-t.C:
	}
	return true
}

// waitForWork blocks until a NOTIFY, a change of lanes or the poll interval
// says to claim again; it returns false when ctx is done. A settlement that
// finishes meanwhile is collected (settle) without a claim.
func (r *Relay) waitForWork(ctx context.Context, wake <-chan struct{}, poll <-chan time.Time, inflight **settlement, settle func()) bool {
	// Positions not saved yet are saved while the relay waits, at most
	// positionEvery after the last save (an idle relay's lanes show their
	// events as passed, and a restart reads nothing again).
	var saveDue <-chan time.Time
	if r.unsavedPositions() {
		t := time.NewTimer(max(positionEvery-time.Since(r.savedAt), 0))
		defer t.Stop()
		saveDue = t.C
	}
	for {
		var written <-chan struct{} // nil (never ready) with nothing in flight
		if *inflight != nil {
			written = (*inflight).done
		}
		select {
		case <-saveDue:
			saveDue = nil
			settle()
			r.savePositionsNow(ctx)
		case <-ctx.Done():
			return false
		case <-wake:
			return true
		case <-r.lanes.changed:
			return true
		case <-poll:
			return true
		case <-written:
			settle()
		}
	}
}

func (r *Relay) shutdown(runCtx context.Context) error {
	if errors.Is(context.Cause(runCtx), errSimulatedCrash) {
		return errSimulatedCrash // a dead process releases nothing
	}
	r.wake.close()
	ctx, cancel := context.WithTimeout(context.Background(), database.QueryTimeout)
	defer cancel()
	r.savePositionsNow(ctx)
	r.lanes.releaseAll(ctx)
	r.log.InfoContext(ctx, "relay stopped", "member", r.cfg.MemberID)
	return nil
}

func (r *Relay) keepLanes(ctx context.Context) {
	// Renew well within the lease so one slow round trip does not lose it.
	service.Every(ctx, service.Loop{Name: "lane lease upkeep", Interval: max(r.cfg.LeaseTimeout/5, 100*time.Millisecond), Logger: r.log,
		Kick: r.lanes.kick}, r.lanes.tick)
}

// listenLanes makes the upkeep tick as soon as another replica announces a
// change of lanes (see LanesChannel), and announces this one once it can
// hear the answers.
func (r *Relay) listenLanes(ctx context.Context) {
	service.Listen(ctx, service.Listener{
		Pool: r.pool, Channel: LanesChannel, Logger: r.log,
		Connected: r.lanes.listening,
		Notified:  r.lanes.heard,
	}, make(chan struct{}, 1)) // the kicks go through Connected/Notified
}

// listen wakes the loop on NOTIFY bridge_outbox (sent by a trigger at
// commit), so an event is produced within milliseconds of its commit; the
// poll interval is only the fallback when the listener is reconnecting.
//
// A notification only wakes the loop: what to read is the batch since the
// lanes' position, whatever committed late.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	service.Listen(ctx, service.Listener{Pool: r.pool, Channel: "bridge_outbox", Logger: r.log}, wake)
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

// slowCycle: a cycle that takes longer is logged with its phases. At 5,000
// events/s a cycle takes a few milliseconds; one that takes seconds shows as
// the p99 of commit→ack, and without the phases there is no telling whether
// PostgreSQL (claim, mark), the broker (produce) or the lease was waiting.
const slowCycle = 500 * time.Millisecond

// reportSlowCycle warns about a cycle slower than slowCycle: from its start
// to the end of the wait for the previous batch's settlement (the loop claims
// the next batch only after that).
func (r *Relay) reportSlowCycle(ctx context.Context, started, waitStarted time.Time, res cycleResult, prev *settlement) {
	took := time.Since(started)
	if took < slowCycle {
		return
	}
	attrs := []any{"took", took.Round(time.Millisecond), "rows", res.claimed,
		"claim", res.claimTook.Round(time.Millisecond), "produce_until_acked", res.produceTook.Round(time.Millisecond),
		"waited_for_previous_marks", time.Since(waitStarted).Round(time.Millisecond),
		"since_lease_renewal", r.lanes.sinceRenewed().Round(time.Millisecond)}
	if prev != nil {
		attrs = append(attrs, "previous_marks_took", prev.took.Round(time.Millisecond), "previous_rows", len(prev.rows))
	}
	r.log.WarnContext(ctx, "slow relay cycle", attrs...)
}

type cycleResult struct {
	claimed int
	// claimTook and produceTook are the claim statement and produce until
	// the last ack (zero when the step did not run).
	claimTook, produceTook time.Duration
	// produced: every record handed to the client; acked: the last ack
	// (zero when nothing was produced). For CycleObserver.
	produced, acked time.Time
	more            bool // the claim left rows behind (batch limit or byte budget)
	outage          bool
}
