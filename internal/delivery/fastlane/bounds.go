package fastlane

import (
	"fmt"
	"time"
)

// Backlog bounds: one subscription's deliveries of one partition held in
// memory and not yet settled are bounded by count, bytes and the age of the
// oldest (Config.MaxWaiting, MaxWaitingBytes, MaxWaitingAge). A
// subscription past one of them, whose backlog is its own, is isolated on
// that partition, so it never holds the partition's offset, or the member's
// memory, for the others.

// backlog is one subscription's deliveries of one partition not yet
// settled: how many, their records' bytes, and queue, the deliveries in the
// order they were taken (its front is trimmed of settled ones when the age
// is read, so the front is the oldest waiting).
type backlog struct {
	count int
	bytes int64
	queue []*item
	// holding: since when the backlog has passed a bound while another
	// subscription keeps up (zero: it does not); see boundGrace.
	holding time.Time
}

// boundGrace: a backlog passes its bounds while another subscription keeps
// up for this long before its subscription is isolated. A backlog every
// subscription shared (a catch-up) ends with one subscription finishing a
// few requests after another: for those milliseconds the last one is past
// a bound alone, and isolating it would send its new streams on the
// partition to the slow lane for IsolationPeriod.
const boundGrace = time.Second

// wait counts it, just taken from p, in its subscription's backlog. l.mu
// held.
func (l *Lane) wait(p *partition, it *item) {
	if p.waiting == nil {
		p.waiting = map[string]*backlog{}
	}
	b := p.waiting[it.sub]
	if b == nil {
		b = &backlog{}
		p.waiting[it.sub] = b
	}
	b.count++
	b.bytes += it.rec.bytes
	b.queue = append(b.queue, it)
}

// unwait takes it, just settled, out of its subscription's backlog. l.mu
// held.
func (l *Lane) unwait(it *item) {
	if b := it.rec.part.waiting[it.sub]; b != nil {
		b.count--
		b.bytes -= it.rec.bytes
	}
}

// age trims b's settled front and returns how long its oldest delivery not
// yet settled has waited since it was polled (0: none).
func (b *backlog) age(now time.Time) time.Duration {
	n := 0
	for n < len(b.queue) && b.queue[n].settled {
		n++
	}
	if n == len(b.queue) {
		b.queue = nil
		return 0
	}
	clear(b.queue[:n])
	b.queue = b.queue[n:]
	return now.Sub(b.queue[0].rec.polled)
}

// overBounds calls isolate for every (partition, subscription) whose
// backlog has passed a bound for boundGrace while
//   - its backlog is its own: every stream of it that has a slot is
//     sending, none waits for a worker. A subscription waiting for workers
//     waits for this member's capacity, the same for every subscription:
//     moving it to PostgreSQL would only make the member slower (a
//     catch-up, where every subscription has a large backlog, isolates no
//     one);
//   - another subscription with deliveries on the partition keeps up
//     (within half of every bound): the backlog holds the offset for it. A
//     partition where every subscription is as far behind isolates no one;
//   - its oldest waiting delivery is in the fast lane (a parked stream's
//     deliveries are on their way to the slow lane already), and it is not
//     isolated there already.
//
// What it is past does not matter: a stream whose single request at a time
// cannot keep up with its events (count and age grow), a subscription at
// its in-flight cap, or one whose cap the slow lane's streams take (see
// capOf). It looks at one backlog per (partition, subscription), never at
// every record held. l.mu held.
func (l *Lane) overBounds(now time.Time, isolate func(p *partition, sub string, why string)) {
	var sending map[string]int
	type state struct {
		sub string
		b   *backlog
		age time.Duration
	}
	var states []state
	for _, p := range l.parts {
		if p.revoked {
			continue
		}
		states = states[:0]
		keepers := 0 // backlogs within half of every bound
		for sub, b := range p.waiting {
			// Read (and trimmed) on every partition, also one with a
			// single subscription: the trim is what lets go of the settled
			// deliveries' pointers.
			st := state{sub, b, b.age(now)}
			states = append(states, st)
			if l.withinHalf(b, st.age) {
				keepers++
			}
		}
		if len(states) < 2 {
			continue // no other subscription to hold the offset for
		}
		for _, st := range states {
			why := l.pastBound(st.b, st.age)
			if why != "" && (keepers == 0 || len(st.b.queue) == 0 || !p.isolated[st.sub].Before(now)) {
				why = ""
			}
			if why != "" {
				if s := l.streams[streamKey{st.sub, assetKey(&st.b.queue[0].rec.msg)}]; s == nil || s.parked {
					why = ""
				}
			}
			if why != "" {
				if sending == nil {
					sending = map[string]int{}
					for s := range l.sending {
						sending[s.key.sub]++
					}
				}
				if ss := l.subs[st.sub]; ss != nil && ss.inFlight > sending[st.sub] {
					why = "" // a stream of it waits for a worker
				}
			}
			switch {
			case why == "":
				st.b.holding = time.Time{}
			case st.b.holding.IsZero():
				st.b.holding = now
			case now.Sub(st.b.holding) >= boundGrace:
				st.b.holding = time.Time{}
				isolate(p, st.sub, why)
			}
		}
	}
}

// pastBound names the bound b is past ("": none).
func (l *Lane) pastBound(b *backlog, age time.Duration) string {
	switch {
	case b.count > l.cfg.MaxWaiting:
		return fmt.Sprintf("%d deliveries waiting on the partition, more than MaxWaiting (%d)", b.count, l.cfg.MaxWaiting)
	case b.bytes > l.cfg.MaxWaitingBytes:
		return fmt.Sprintf("%d bytes of records waiting on the partition, more than MaxWaitingBytes (%d)", b.bytes, l.cfg.MaxWaitingBytes)
	case age > l.cfg.MaxWaitingAge:
		return fmt.Sprintf("its oldest delivery on the partition waiting %s, longer than MaxWaitingAge (%s)",
			age.Round(time.Millisecond), l.cfg.MaxWaitingAge)
	}
	return ""
}

// withinHalf reports whether b is within half of every bound: its
// subscription keeps up on the partition.
func (l *Lane) withinHalf(b *backlog, age time.Duration) bool {
	return b.count <= l.cfg.MaxWaiting/2 && b.bytes <= l.cfg.MaxWaitingBytes/2 && age <= l.cfg.MaxWaitingAge/2
}
