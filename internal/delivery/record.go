package delivery

import (
	"context"
	"log/slog"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/service"
)

// outcomeQueues are the recorders' inputs (see Run).
type outcomeQueues struct{ delivered, retries chan recorded }

// recorded is a success or retry on its way to the recorder.
type recorded struct {
	res    store.Result
	ctx    context.Context
	status int
}

// recordEvery is the longest spacing between two batches of one recorder
// (see recordLoop; the spacing follows what batches take to write).
const recordEvery = 10 * time.Millisecond

// successRecorders write successes side by side: one recorder wrote a
// batch of 22–30 outcomes every 6–9 ms under bench pipeline's load, busy
// nearly all the time, and a delivery counts against its subscription's
// cap until its outcome is written. Their batches never touch the same
// delivery, and take subscription rows in id order and stream rows with
// SKIP LOCKED, so they do not wait on each other.
const successRecorders = 2

// maxRecordBatch bounds one outcome transaction.
const maxRecordBatch = 512

// recordLoop writes successes and retries in batches: whatever has arrived
// while the previous batch was being written and the rest of recordEvery
// since it began, up to maxRecordBatch. Under light load a batch is one
// outcome, written at once; under heavy load one WAL flush and three
// statements serve many deliveries. It returns when in is closed and
// everything in it is written.
func (d *Deliverer) recordLoop(in <-chan recorded) {
	batch := make([]recorded, 0, maxRecordBatch)
	var last time.Time
	var cost pace
	for first := range in {
		// At most one batch per recordEvery: the cost of a batch is mostly
		// per statement (three of them, and a commit), and with a batch
		// written as soon as the last one was, ~190 batches a second of ~16
		// rows each wrote bench pipeline's 3,000 successes a second.
		// Waiting for the rest of the interval batches ~21; an outcome that
		// arrives after a quiet interval is written at once. The spacing
		// follows what batches have lately taken to write (cost.gap): on a
		// machine with CPU to spare a batch takes a millisecond, and the
		// full wait held the stream's next delivery (its stream is in
		// flight until the outcome is written) for nothing.
		if wait := cost.gap(recordEvery) - time.Since(last); wait > 0 {
			time.Sleep(wait)
		}
		last = time.Now()
		batch = append(batch[:0], first)
	fill:
		for len(batch) < maxRecordBatch {
			select {
			case r, ok := <-in:
				if !ok {
					break fill
				}
				batch = append(batch, r)
			default:
				break fill
			}
		}
		d.record(batch)
		cost.observe(time.Since(last))
		var bytes int64
		for _, r := range batch {
			bytes += int64(r.res.Claim.PayloadBytes)
		}
		d.done(len(batch), bytes)
	}
}

// done gives back the slots and bytes of n claims whose outcome is written
// (or that were released), and wakes the claim loops.
func (d *Deliverer) done(n int, bytes int64) {
	d.inFlight.Add(-int64(n))
	d.bytesOut.Add(-bytes)
	d.poke()
}

// record writes one batch. A batch that cannot be written is not lost
// work: its deliveries stay 'delivering' until their lease runs out, and
// reclaim sends them again (same webhook-id, attempt kept).
func (d *Deliverer) record(batch []recorded) {
	rs := make([]store.Result, len(batch))
	async := !d.cfg.SyncSuccessCommit
	for i, r := range batch {
		rs[i] = r.res
		async = async && r.res.Kind == store.Delivered
	}
	var current []bool
	began := time.Now()
	defer func() {
		d.stats.progress.Add(1)
		d.stats.records.Add(1)
		d.stats.recorded.Add(int64(len(batch)))
		d.stats.recordNanos.Add(int64(time.Since(began)))
	}()
	err := service.Retry(context.Background(), service.Wait{Name: "record delivery outcomes", Timeout: queryTimeout,
		AttemptTimeout: queryTimeout, Logger: d.log}, func(ctx context.Context) error {
		var err error
		current, err = d.store.Record(ctx, d.cfg.ID, rs, store.RecordOptions{Async: async})
		return err
	})
	debug := d.log.Enabled(context.Background(), slog.LevelDebug)
	for i, r := range batch {
		out := r.res.Outcome
		if r.res.Kind == store.Delivered && err == nil && current[i] && !debug {
			continue // the common case logs nothing: no logger built
		}
		log := d.claimLog(r.res.Claim)
		switch {
		case err != nil && r.res.Kind == store.Delivered:
			log.ErrorContext(r.ctx, "delivered, but recording it failed; the lease will return it and it will be sent again", "err", err)
		case err != nil:
			log.ErrorContext(r.ctx, "recording a failed attempt failed", "err", err, "error", out.Error)
		case !current[i] && r.res.Kind == store.Delivered:
			log.WarnContext(r.ctx, "delivered after the claim was reclaimed (lease expired); it may be sent twice", "status", r.status)
		case !current[i]:
			log.WarnContext(r.ctx, "failed after the claim was reclaimed; outcome logged only", "error", out.Error)
		case r.res.Kind == store.Delivered:
			log.DebugContext(r.ctx, "delivered", "status", r.status, "duration", out.Duration)
		default:
			log.WarnContext(r.ctx, "attempt failed; will retry", "error", out.Error, "status", r.status,
				"retry_in", r.res.RetryIn.Round(time.Millisecond))
		}
	}
}
