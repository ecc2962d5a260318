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
// allows (it grew with the partitions owned). l.mu held.
func (l *Lane) admitWaiting() {
	limit := l.subCap()
	for _, sub := range l.subs {
		l.admit(sub, limit)
	}
}
