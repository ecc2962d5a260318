package delivery

import "time"

// pace is what a repeated statement of one loop has lately cost in wall
// time (a moving average of its last few runs, newest weighted 1/4), the
// load signal the claim and outcome lingers follow. On a machine with CPU
// to spare a claim takes a few milliseconds; on a saturated one the same
// claim waits in the run queue and takes tens. Waiting between statements
// saves CPU only in the second case, and costs latency in both.
type pace struct{ avg time.Duration }

// observe adds one run's wall time.
func (p *pace) observe(took time.Duration) {
	if p.avg == 0 {
		p.avg = took
		return
	}
	p.avg += (took - p.avg) / 4
}

// gap is the shortest time from the start of one run to the start of the
// next: paceShare times what a run lately cost, at most limit. A loop that
// waits so runs its statement at most 1/paceShare of the time while it has
// little to do, and never waits longer than limit. Before the first run
// nothing is known and nothing is waited.
func (p pace) gap(limit time.Duration) time.Duration { return min(limit, paceShare*p.avg) }

// paceShare: a gap of the statement's own time (a share of 1/2, measured
// from the run's start: no wait at all) makes ~500 claims a second of ~2
// rows in bench deliver's live phase at 1,000/s (10 subscriptions), and
// raises its p99: on a 2-core machine the claims' CPU is what the tail
// waits for even there. With 4, a claim of 5 ms (that machine, that load)
// waits the whole 20 ms claimLinger; only claims under 5 ms — a machine
// with CPU to spare — wait less.
const paceShare = 4

// claimGap is how long a claim loop leaves between two claims (see
// claimLoop): none while nothing is out (an idle deliverer answers at once)
// or no slot is free (the loop waits for a poke anyway), nor while at least
// minClaim slots are free and the last claim was not lean (a light load:
// latency first). Otherwise up to claimLinger after a lean claim (claims
// cost more than they bring) or fewFreeLinger when few slots are free
// (the next claim takes what frees up meanwhile) — but never longer than
// paceShare times what the loop's claims have lately taken (cost), so the
// linger grows with the load: a deliverer with CPU to spare, whose claims
// take 2 ms, lingers 8 ms, and a loaded one, whose claims take 5 ms and
// more, lingers the whole claimLinger.
func claimGap(out, capacity, minClaim int, lean bool, cost pace) time.Duration {
	free := capacity - out
	if out <= 0 || free <= 0 || (free >= minClaim && !lean) {
		return 0
	}
	if lean {
		return cost.gap(claimLinger)
	}
	return cost.gap(fewFreeLinger)
}
