package delivery

import (
	"context"
	"sync"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// pipeline is the delivery service: ClaimLoops claim loops (claim.go) feed
// Workers workers (send.go), whose successes and retries go to the
// recorders (record.go). It is one service because its three stages share
// one budget of claim slots and bytes and one ordered shutdown: claiming
// stops first, requests in flight get ShutdownGrace, and every outcome is
// written before Run releases the claims still held — releasing one whose
// answer is waiting in a recorder would send it again and un-charge an
// attempt that was made.
type pipeline struct{ d *Deliverer }

func (p *pipeline) Name() string { return "deliver" }

func (p *pipeline) Run(ctx context.Context) {
	d := p.d
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
	var workers, recorder sync.WaitGroup
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
	close(results.delivered)
	close(results.retries)
	recorder.Wait()
}
