package fastlane

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// subCap is one subscription's requests in flight at most in this member's
// fast lane: MaxInFlightPerSubscription times the share of the topics'
// partitions this member owns, rounded down and at least 1, so the members
// of the group together never have more than MaxInFlightPerSubscription of
// one subscription's requests in flight (12 partitions, a cap of 64: one
// member 64; two with 6 each 32 + 32; three with 4 each 21 × 3 = 63; 5 and
// 7 partitions 26 + 37). Before the topics' partition count is known it is
// the whole cap. l.mu held.
func (l *Lane) subCap() int {
	if l.totalParts <= 0 {
		return l.cfg.MaxInFlightPerSubscription
	}
	owned := 0
	for _, p := range l.parts {
		if !p.revoked {
			owned++
		}
	}
	return max(1, l.cfg.MaxInFlightPerSubscription*owned/l.totalParts)
}

// countPartitions reads how many partitions the topics consumed have (the
// denominator of subCap), on each assignment: a topic that gains
// partitions, or a new one matching a pattern, changes it.
func (l *Lane) countPartitions(ctx context.Context) {
	topics := l.client.GetConsumeTopics()
	if len(topics) == 0 {
		return
	}
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	td, err := kadm.NewClient(l.client).ListTopics(mctx, topics...)
	if err != nil {
		l.log.WarnContext(ctx, "reading the topics' partition count failed; the per-subscription cap stays as it was", "err", err)
		return
	}
	total := 0
	for _, t := range td {
		if t.Err == nil {
			total += len(t.Partitions)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if total > 0 {
		l.totalParts = total
	}
	l.admitWaiting()
}

// admitWaiting starts the streams waiting for a slot that the cap now
// allows (it grew with the partitions owned, or the slow lane has fewer
// streams of the subscription). l.mu held.
func (l *Lane) admitWaiting() {
	for id, sub := range l.subs {
		l.admit(sub, l.capOf(id))
	}
}

// capOf is subscription sub's requests in flight at most in this member's
// fast lane: its share of the cap (subCap) less one slot per stream of it
// the slow lane may be sending (slowStreams), so both lanes together keep
// within MaxInFlightPerSubscription without the fast lane writing anything
// per delivery. The slow lane sends at most one request per parked stream
// (one in flight per stream) and at most the cap in all (its claim counts
// its own 'delivering' rows), so what this member leaves it is an upper
// bound of what it can have in flight. 0 when the slow lane may use the
// whole share: the subscription's fast-lane streams wait for slots (and, if
// the wait passes a backlog bound, the subscription is isolated). l.mu
// held.
func (l *Lane) capOf(sub string) int {
	return max(0, l.subCap()-l.slowStreams[sub])
}

// countSlowStreams recounts the streams the slow lane may be sending:
// those with a marker in parked (the last read of bridge.delivery_parks, by
// whichever member or writer parked them) and those this member holds
// parked (its own parks, whose markers that read may have missed), then
// starts the streams the cap now allows. Counting every marker of the
// subscription, not only those of this member's partitions, gives up slots
// when several members share it; the sum of what the members take stays
// within the cap minus the slow lane's streams. l.mu held.
func (l *Lane) countSlowStreams(parked map[streamKey]bool) {
	clear(l.slowKeys)
	clear(l.slowStreams)
	for key := range parked {
		l.slowKeys[key] = true
		l.slowStreams[key.sub]++
	}
	for key, s := range l.streams {
		if s.parked {
			l.reserveSlot(key)
		}
	}
	l.admitWaiting()
}

// reserveSlot counts stream key as one the slow lane may be sending. l.mu
// held.
func (l *Lane) reserveSlot(key streamKey) {
	if !l.slowKeys[key] {
		l.slowKeys[key] = true
		l.slowStreams[key.sub]++
	}
}

// parkSlot reports whether a new park of s may be written now: it reserves
// the slot s's rows take in the slow lane, and the subscription's fast-lane
// requests in flight must be within what capOf leaves them. A head that
// failed gives its slot back before its stream parks, and the slot may go
// to another stream of the subscription meanwhile; written at once, the
// parked head could then be claimed while that request runs — one over the
// cap. The hand-over waits instead (at most one request's time: capOf
// admits nothing new meanwhile). l.mu held.
func (l *Lane) parkSlot(s *stream) bool {
	l.reserveSlot(s.key)
	sub := l.subs[s.key.sub]
	return sub == nil || sub.inFlight <= l.capOf(s.key.sub)
}
