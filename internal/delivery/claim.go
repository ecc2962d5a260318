package delivery

import (
	"context"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/service"
)

// capacity is how many claims may be out at once: two per worker — one in
// a request, one queued or waiting for its outcome to be written. The claim
// statement costs about the same for 5 rows as for 30, and the claim loop is
// serial, so claiming only for idle workers made it the bottleneck (a claim
// returned the few workers that freed up during the previous one). The
// queue is bounded, so memory stays bounded by the worker count, whatever
// the backlog; queued claims hold only rows that are their stream's next
// anyway.
func (d *Deliverer) capacity() int { return 2 * d.cfg.Workers }

// claimLinger is the longest wait between two claims of one loop while
// claims are out and the last claim was lean, fewFreeLinger while claims
// are out and fewer than a quarter of the slots are free (see claimGap:
// the wait is no longer than the loop's claims have lately taken, so only
// a loaded machine waits this long). With nothing out a loop claims at
// once: an idle deliverer adds no latency.
//
// 20 ms rather than 5: a claim costs about the same for 5 rows as for 30
// (the locks, the window of streams, the commit), and on a saturated
// machine that fixed cost is what the other stages wait for. In bench
// pipeline (1,000 events/s × 3 subscriptions, 2 cores busy), 20 ms here
// and recordEvery together took PostgreSQL's CPU for the bridge from 0.90
// to 0.76 cores (one run each). The price is the per-subscription slot cycle: a slot
// freed by an outcome is claimed again up to claimLinger later, so one
// subscription's throughput is bounded near
// WEBHOOK_MAX_IN_FLIGHT_PER_SUBSCRIPTION / (claimLinger + recordEvery +
// request + write), ~1,400/s for 64 slots and a 10 ms request — raise the
// cap for a single subscription that needs more.
const claimLinger = 20 * time.Millisecond

// fewFreeLinger: see claimLinger. A draining backlog's claims are not lean
// (each takes what a quarter of the slots freed), so it keeps the 5 ms its
// claims had before.
const fewFreeLinger = 5 * time.Millisecond

// contendedRetry is the first wait of a loop whose subscriptions another
// replica's claim was serving (doubling up to 16×, see claimLoop).
const contendedRetry = 5 * time.Millisecond

// reserve takes up to n of the free claim slots (capacity minus claims out)
// for one claim, so claim loops running at once never hand out more than
// capacity together.
func (d *Deliverer) reserve(n int) int {
	for {
		out := d.inFlight.Load()
		take := min(int64(n), int64(d.capacity())-out)
		if take <= 0 {
			d.starved.Store(true)
			return 0
		}
		if d.inFlight.CompareAndSwap(out, out+take) {
			return int(take)
		}
	}
}

// reserveBytes takes a share of the payload bytes left of ClaimBytes for
// one claim: 1/ClaimLoops of what is left, so loops claiming at once never
// hold more than ClaimBytes together, plus at most one payload each (a
// claim returns its first row whatever its size). 0 means the budget is
// spent: the loop claims nothing until outcomes give bytes back (they poke).
func (d *Deliverer) reserveBytes() int64 {
	for {
		out := d.bytesOut.Load()
		left := int64(d.cfg.ClaimBytes) - out
		if left <= 0 {
			d.starved.Store(true)
			return 0
		}
		take := max(1, left/int64(d.cfg.ClaimLoops))
		if d.bytesOut.CompareAndSwap(out, out+take) {
			return take
		}
	}
}

// claimLoop claims for its share of the subscriptions (loop of ClaimLoops)
// whenever a notification, a written outcome, a reclaim or the poll tick
// says there may be work. Several loops claim at once, each for different
// subscriptions, so the claim statement's latency no longer bounds the rate
// of the whole deliverer; the per-subscription cap stays exact because a
// subscription is claimed for by one claim at a time (see store.ClaimShare).
// A loop takes at most twice its even share of the free slots per claim, and
// no more than its subscriptions can take, so one loop cannot starve the
// others.
func (d *Deliverer) claimLoop(ctx context.Context, jobs chan<- store.Claim, loop int) {
	ticker := time.NewTicker(d.cfg.PollInterval)
	defer ticker.Stop()
	wake := d.wakes[loop]
	share := max(1, 2*d.capacity()/d.cfg.ClaimLoops)
	// A claim statement has a fixed cost (the stream scan, the locks, the
	// commit) whatever it returns, so under load claiming for every written
	// outcome batch made many claims of a few rows each: 3,476 claims of
	// 8.6 rows for 30,000 deliveries. Unless a quarter of the slots are free
	// (a light load: claim at once, latency first) or nothing is out (idle),
	// a loop claims at most every claimLinger.
	//
	// A claim that found little (fewer than minClaim rows) also makes the
	// next one wait: with several replicas the per-subscription cap, not
	// this process's slots, is what binds, so slots stayed free and every
	// written outcome set off a claim of the one or two rows freed by it —
	// 25,000 claims of ~1 row for 30,000 deliveries with 3 replicas, slower
	// together than one alone. While claims are out this costs a delivery
	// at most claimLinger of latency; with none out, nothing.
	//
	// How long a loop lingers follows what its claims cost (see
	// claimGap): a fixed 20 ms made every lightly loaded delivery wait up
	// to 20 ms for the next claim, on a machine whose claims take 1–2 ms
	// and which has the CPU for more of them.
	minClaim := max(1, d.capacity()/4)
	var last time.Time
	var cost pace
	// served: how many subscriptions the loop's last claim served (0: none
	// or no claim yet); see reserve below.
	served := 0
	failures, contendedEmpty := 0, 0
	lean := false
	for {
		if gap := claimGap(int(d.inFlight.Load()), d.capacity(), minClaim, lean, cost); gap > 0 {
			if wait := gap - time.Since(last); wait > 0 && !service.Sleep(ctx, wait) {
				return
			}
		}
		last = time.Now()
		full, soon := false, false
		var rateWait, probeWait time.Duration
		if d.capacity()-int(d.inFlight.Load()) <= 0 {
			d.starved.Store(true) // whoever gives slots back wakes the loops
		} else {
			// Slots are reserved for at most what the loop's subscriptions
			// can take (their cap each), as many as its last claim served
			// (the claim is sent in one round trip with the statements that
			// find them). Reserved for twice the loop's even share, two
			// loops' claims held every free slot while they ran and
			// returned 8 rows each, and the other loops, starved, claimed
			// nothing until poked (3 subscriptions at 1,000 events/s each:
			// ~2,000 deliveries/s). Before its first claim, or after one
			// that served none (all contended), a loop does not know, and
			// reserves its share: what the claim does not take is given
			// back as soon as it returns.
			var want int
			var budget int64
			reserve := func() (int, int) {
				n := share
				if served > 0 {
					n = min(share, served*d.cfg.MaxInFlightPerSubscription)
				}
				if want = d.reserve(n); want == 0 {
					return 0, 0
				}
				if budget = d.reserveBytes(); budget == 0 {
					d.inFlight.Add(-int64(want))
					want = 0
				}
				return want, int(budget)
			}
			// Subscriptions whose endpoint fails every stream take one
			// probe at a time (see breakers); probeWait wakes the loop when
			// the next may go.
			held, probing, wait := d.breakers.plan(time.Now())
			probeWait = wait
			qctx, cancel := context.WithTimeout(ctx, queryTimeout)
			began := time.Now()
			res, err := d.store.ClaimShare(qctx, store.ClaimParams{
				ClaimedBy: d.cfg.ID, MaxInFlight: d.cfg.MaxInFlightPerSubscription, Lease: d.cfg.Lease,
				Loops: d.cfg.ClaimLoops, Loop: loop, Reserve: reserve, Held: held, Probing: probing,
			})
			if err == nil {
				d.breakers.claimed(res.Claims, time.Now())
			}
			claims, contended := res.Claims, res.Contended
			if err == nil && want > 0 {
				served = res.Subscriptions
			}
			// A rate-limited subscription out of tokens: nothing will poke
			// this loop when its next token is due, so it sets a timer
			// rather than waiting for the poll tick (or polling).
			rateWait = res.RateWait
			cancel()
			if want > 0 {
				took := time.Since(began)
				// Progress: a claim that served subscriptions (or found
				// another replica serving them), whatever it returned. A
				// loop whose share holds none claims "successfully" forever.
				if err == nil && (res.Subscriptions > 0 || res.Contended > 0) {
					d.stats.progress.Add(1)
				}
				d.stats.claims.Add(1)
				d.stats.claimed.Add(int64(len(claims)))
				d.stats.claimNanos.Add(int64(took))
				if err == nil {
					cost.observe(took)
				}
			}
			var got int64
			for _, c := range claims {
				got += int64(c.PayloadBytes)
			}
			d.bytesOut.Add(got - budget) // what the claim took, not what it might have
			if unused := want - len(claims); unused > 0 {
				// Slots another loop may have found taken while this one
				// held them: without the poke it would wait for the tick.
				d.inFlight.Add(-int64(unused))
				if d.starved.Swap(false) {
					d.poke()
				}
			}
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				failures++
				d.log.ErrorContext(ctx, "claim failed; retrying", "err", err, "consecutive_failures", failures)
			default:
				failures = 0
				for _, c := range claims {
					jobs <- c // never blocks: at most capacity claims are out
				}
				full = want > 0 && len(claims) == want
				lean = len(claims) < minClaim
				// Another replica's claim is serving some of these
				// subscriptions right now: look again soon rather than at
				// the next tick, backing off while it stays so (5, 10, 20,
				// 40, 80 ms) — that replica is claiming for them, and
				// retrying every 5 ms only split their freed slots into
				// ever smaller claims.
				if soon = contended > 0 && len(claims) == 0; soon {
					contendedEmpty++
				} else {
					contendedEmpty = 0
				}
			}
		}
		if full {
			continue // there may be more; workers are busy now, so free will be 0 or small
		}
		var again, due <-chan time.Time
		if soon {
			again = time.After(contendedRetry << min(contendedEmpty-1, 4))
		}
		if w := minPositive(rateWait, probeWait); w > 0 {
			due = time.After(w)
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-again:
		case <-due:
		case <-ticker.C:
		}
	}
}

// minPositive is the smaller of a and b that is above 0 (0: neither is).
func minPositive(a, b time.Duration) time.Duration {
	switch {
	case a <= 0:
		return max(b, 0)
	case b <= 0:
		return a
	}
	return min(a, b)
}
