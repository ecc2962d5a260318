package relay

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The cycle: claim a batch and hand it to the Kafka client; once its acks
// are in, judge each failure (outage, poison, charge) before its settlement
// is written. Batches overlap: the next one is claimed and produced while
// the acks of the ones before it are outstanding (at most maxInFlight), and
// they are judged and settled in claim order.

// maxInFlight bounds the batches whose acks are outstanding at once. A
// serial cycle (claim, produce, wait for every ack, claim again) made an
// event that committed during a produce wait for that produce's acks before
// its own claim; at 1,000 events/s the broker's acks were most of the
// commit→ack p99.
const maxInFlight = 4

// batch is one claim on its way to the broker, from its claim until it is
// judged. Only the relay loop touches it (the ack callbacks write results
// and the wait group only).
type batch struct {
	s   *settlement
	res cycleResult
	// toSend: the rows handed to the client (indices into s.rows).
	toSend []int
	// waiting: rows whose asset has a row in an earlier batch not judged
	// yet. They go out once that batch is judged (when this one is the
	// oldest), or are held behind their asset if it failed there (blocked):
	// a later row of an asset never reaches the client before the earlier
	// one's fate is known, so it can neither overtake a failing head nor
	// land while the earlier row is retried.
	waiting []int
	blocked map[string]bool
	// assets: every asset with a row in the batch (produced, waiting or
	// held); a later batch's rows of these assets wait for this one.
	assets map[string]bool
	acks   sync.WaitGroup
	// outstanding: records handed to the client whose ack is not in.
	outstanding atomic.Int64
	pctx        context.Context
	cancel      context.CancelFunc
}

// acked says whether every row of b that goes out has its ack (or failure).
func (b *batch) acked() bool { return len(b.waiting) == 0 && b.outstanding.Load() == 0 }

// heldIDs are the held rows of the batches in flight, by id: a claim does
// not send them twice.
func heldIDs(queue []*batch) map[string]bool {
	out := map[string]bool{}
	for _, b := range queue {
		for _, w := range b.s.rows {
			if w.Held {
				out[w.ID.String()] = true
			}
		}
	}
	return out
}

// startBatch claims one batch (skipping what the settlement being written
// and the batches in flight cover) and hands to the client every row whose
// asset has no row in a batch in flight. It returns nil when nothing was
// claimed and there is nothing to write.
func (r *Relay) startBatch(ctx context.Context, lanes []int, inflight *settlement, queue []*batch) (*batch, cycleResult, error) {
	started := time.Now()
	before := r.checkpoint()
	c, err := r.claim(ctx, lanes, inflight, heldIDs(queue))
	if errors.Is(err, errServerChanged) {
		r.forgetPositions()
		return nil, cycleResult{claimTook: time.Since(started)}, err
	}
	if err != nil {
		r.restore(before)
		return nil, cycleResult{claimTook: time.Since(started)}, err
	}
	claimedAt := time.Now()
	res := cycleResult{claimStart: started, claimed: len(c.rows) + len(c.hold), more: c.more, claimTook: claimedAt.Sub(started)}
	if c.more && len(queue) == 0 {
		// A backlog: the next page is read while this one is produced.
		// (With batches in flight their settlements are not written yet, and
		// a read from before them could miss the holds they write.)
		r.startPrefetch(ctx, lanes, inflight)
	}
	rows, rest := sameTopicRuns(c.rows)
	for _, w := range rest {
		if !w.Held {
			c.hold = append(c.hold, w)
		}
	}
	s := &settlement{before: before, rows: rows, hold: c.hold, results: make([]sendResult, len(rows)), unsettled: map[string]bool{}, done: make(chan struct{})}
	s.save = r.positionsToSave()
	if len(rows) == 0 && len(s.hold) == 0 && s.save == nil {
		return nil, res, nil
	}
	b := &batch{s: s, res: res, blocked: map[string]bool{}, assets: map[string]bool{}}
	b.pctx, b.cancel = context.WithTimeout(ctx, r.cfg.ProduceTimeout+5*time.Second)
	earlier := map[string]bool{}
	for _, q := range queue {
		for k := range q.assets {
			earlier[k] = true
		}
	}
	for _, w := range s.hold {
		b.assets[w.AssetKey()] = true
	}
	var now []int
	for i, w := range rows {
		k := w.AssetKey()
		b.assets[k] = true
		if w.PayloadBytes > r.cfg.MaxMessageBytes {
			s.oversized = append(s.oversized, i)
			continue
		}
		if earlier[k] {
			b.waiting = append(b.waiting, i)
			continue
		}
		now = append(now, i)
	}
	r.send(b, now)
	b.res.produced = time.Now()
	return b, b.res, nil
}

// release hands b's waiting rows to the client once every batch before it
// is judged; the rows of an asset that failed in one of them stay unsent
// (a log row is held behind its asset, uncharged, by the settlement; a held
// row stays where it is) and the asset counts as failing in b.
func (r *Relay) release(b *batch) {
	if len(b.waiting) == 0 {
		return
	}
	var now []int
	for _, i := range b.waiting {
		if k := b.s.rows[i].AssetKey(); b.blocked[k] {
			b.s.unsettled[k] = true
			continue
		}
		now = append(now, i)
	}
	b.waiting = nil
	r.send(b, now)
	b.res.produced = time.Now()
}

// judged passes on what b's judgement found to the batches after it: the
// waiting rows of an asset that failed (or was held) in b are held.
func judged(b *batch, later []*batch) {
	for k := range b.s.unsettled {
		for _, q := range later {
			q.blocked[k] = true
		}
	}
}

// discard waits for the acks of batches whose rows are read again (an
// outage, or a batch retried uncharged before them): what went out goes out
// again with the same dedup-id.
func discard(queue []*batch) {
	for _, b := range queue {
		b.acks.Wait()
		b.cancel()
	}
}

// judge waits for b's acks (b is the oldest batch in flight, its waiting
// rows released) and judges each failure. It returns b's settlement to
// write (nil: nothing to write) or, when nothing got through for the
// broker's sake, outage or retry: the caller restores the read state from
// before b and discards the batches after it.
func (r *Relay) judge(ctx context.Context, b *batch) (s *settlement, outage, retry bool, err error) {
	b.acks.Wait()
	b.cancel()
	s, res := b.s, &b.res
	rows, results := s.rows, s.results
	if len(b.toSend) > 0 {
		res.acked = time.Now()
		res.produceTook = res.acked.Sub(res.claimStart.Add(res.claimTook))
	}
	if r.testCrashAfterProduce != nil && len(rows) > 0 && r.testCrashAfterProduce() {
		return nil, false, false, errSimulatedCrash
	}
	toSend := slices.Clone(b.toSend)
	slices.Sort(toSend)
	var failed []int
	for _, i := range toSend {
		if results[i].err == nil {
			s.sent = append(s.sent, i)
		} else {
			failed = append(failed, i)
			s.unsettled[rows[i].AssetKey()] = true
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
			return nil, true, false, nil
		}
		if !r.unchargedRetryUsed {
			// A broker that answers now may have been down while these
			// records were in flight (an outage ending mid-batch). Retry once
			// without charging; if the next batch fails the same way with
			// the broker up, the failures are the rows' own.
			r.unchargedRetryUsed = true
			r.log.WarnContext(ctx, "nothing in the batch got through but a broker answers; retrying once before charging",
				"rows", len(failed), "error", results[failed[0]].err)
			return nil, false, true, nil
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
	// same asset are collateral: they are held, uncharged, behind their head
	// (every log row of the batch that did not go out is held, see
	// settlement.write).
	heads := map[string]bool{}
	for _, i := range failed { // failed is in seq order
		k := rows[i].AssetKey()
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
	if len(rows) == 0 && len(s.hold) == 0 && s.save == nil {
		return nil, false, false, nil
	}
	return s, false, false, nil
}
