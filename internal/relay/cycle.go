package relay

import (
	"context"
	"errors"
	"time"
)

// The cycle: claim a batch, produce it, and judge each failure (outage,
// poison, charge) before the settlement is written.

// cycle claims one batch (skipping what the settlement still being written
// covers), produces it, waits for every ack and judges each failure. It
// returns the settlement to write; nil when nothing was claimed.
func (r *Relay) cycle(ctx context.Context, lanes []int, inflight *settlement) (cycleResult, *settlement, error) {
	started := time.Now()
	before := r.checkpoint()
	c, err := r.claim(ctx, lanes, inflight)
	if errors.Is(err, errServerChanged) {
		r.forgetPositions()
		return cycleResult{claimTook: time.Since(started)}, nil, err
	}
	if err != nil {
		r.restore(before)
		return cycleResult{claimTook: time.Since(started)}, nil, err
	}
	claimedAt := time.Now()
	res := cycleResult{claimed: len(c.rows) + len(c.hold), more: c.more, claimTook: claimedAt.Sub(started)}
	if c.more {
		// A backlog: the next page is read while this one is produced.
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
	if len(rows) == 0 {
		if len(s.hold) == 0 && s.save == nil {
			return res, nil, nil
		}
		return res, s, nil
	}
	results := s.results
	var toSend []int
	for i, w := range rows {
		if w.PayloadBytes > r.cfg.MaxMessageBytes {
			s.oversized = append(s.oversized, i)
			continue
		}
		toSend = append(toSend, i)
	}
	res.produced = r.produce(ctx, rows, toSend, results)
	res.acked = time.Now()
	res.produceTook = res.acked.Sub(claimedAt)
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
			res.outage = true
			r.restore(before)
			return res, nil, nil
		}
		if !r.unchargedRetryUsed {
			// A broker that answers now may have been down while these
			// records were in flight (an outage ending mid-batch). Retry once
			// without charging; if the next batch fails the same way with
			// the broker up, the failures are the rows' own.
			r.unchargedRetryUsed = true
			r.log.WarnContext(ctx, "nothing in the batch got through but a broker answers; retrying once before charging",
				"rows", len(failed), "error", results[failed[0]].err)
			r.restore(before)
			return res, nil, nil
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
	return res, s, nil
}
