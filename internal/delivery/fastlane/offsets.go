package fastlane

import (
	"context"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/service"
)

// Offsets: committing each partition up to its lowest unsettled record,
// and what the lane does when the group assigns, revokes or loses partitions.

// commit commits, for every partition still owned, the offset of its lowest
// record not yet settled by every subscription.
func (l *Lane) commit(ctx context.Context) error {
	offsets := l.settledOffsets(func(p *partition) bool { return !p.revoked })
	if len(offsets) == 0 {
		return nil
	}
	var cerr error
	l.stats.commits.Add(1)
	l.client.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) { cerr = err })
	return cerr
}

// settledOffsets advances the partitions chosen past their settled prefix
// and returns the offsets to commit. It takes l.mu.
func (l *Lane) settledOffsets(which func(*partition) bool) map[string]map[int32]kgo.EpochOffset {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]map[int32]kgo.EpochOffset{}
	for _, p := range l.parts {
		if !which(p) {
			continue
		}
		var last *record
		n := 0
		for n < len(p.recs) && p.recs[n].pending == 0 {
			last = p.recs[n]
			l.buffered -= last.bytes
			n++
		}
		if last == nil {
			continue
		}
		clear(p.recs[:n])
		p.recs = p.recs[n:]
		next := last.rec.Offset + 1
		if next <= p.committed {
			continue
		}
		p.committed = next
		if out[p.tp.topic] == nil {
			out[p.tp.topic] = map[int32]kgo.EpochOffset{}
		}
		out[p.tp.topic][p.tp.partition] = kgo.EpochOffset{Epoch: last.rec.LeaderEpoch, Offset: next}
	}
	if len(out) > 0 {
		l.idle.Broadcast() // memory was given back
	}
	return out
}

// assigned creates the new partitions' state and reads the park markers
// before the first of their records is fetched, and the topics' partition
// count (see subCap).
func (l *Lane) assigned(ctx context.Context, _ *kgo.Client, added map[string][]int32) {
	var keys []store.Stream
	_ = service.Retry(ctx, service.Wait{Name: "read park markers on assignment", Logger: l.log, LogEvery: 10 * time.Second},
		func(ctx context.Context) error {
			var err error
			keys, err = l.store.Parks(ctx)
			return err
		})
	l.mu.Lock()
	for _, k := range keys {
		key := streamKey{k.SubscriptionID, k.AssetKey}
		l.parkedKeys[key] = true
		if s := l.streams[key]; s != nil && !s.parked && !s.sending && len(s.fast) == 0 {
			s.parked = true
		}
	}
	for topic, ps := range added {
		for _, id := range ps {
			tp := topicPartition{topic, id}
			l.parts[tp] = &partition{tp: tp, committed: -1, next: -1, highWatermark: -1, isolated: map[string]time.Time{}}
		}
	}
	l.mu.Unlock()
	l.log.InfoContext(ctx, "partitions assigned", "partitions", added, "parked_streams", len(keys))
	l.countPartitions(ctx)
}

// revoked stops taking work of the partitions, waits (ShutdownGrace at
// most) for their requests and hand-overs in flight, commits what is
// settled and forgets them; the new owner starts from that offset and
// re-sends the rest with the same webhook-ids.
func (l *Lane) revoked(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
	l.drop(ctx, lost, true)
}

// lost: the group already gave the partitions away; nothing is committed.
func (l *Lane) lost(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
	l.drop(ctx, lost, false)
}

func (l *Lane) drop(ctx context.Context, gone map[string][]int32, commit bool) {
	l.mu.Lock()
	var ps []*partition
	for topic, ids := range gone {
		for _, id := range ids {
			if p := l.parts[topicPartition{topic, id}]; p != nil {
				p.revoked = true
				ps = append(ps, p)
			}
		}
	}
	if len(ps) == 0 {
		l.mu.Unlock()
		return
	}
	deadline := time.Now().Add(l.cfg.ShutdownGrace)
	timer := time.AfterFunc(l.cfg.ShutdownGrace, func() { l.mu.Lock(); l.idle.Broadcast(); l.mu.Unlock() })
	defer timer.Stop()
	for (l.handing > 0 || l.sendingFrom(ps)) && time.Now().Before(deadline) {
		l.waitIdle()
	}
	l.mu.Unlock()
	if commit {
		offsets := l.settledOffsets(func(p *partition) bool { return p.revoked })
		if len(offsets) > 0 {
			l.client.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) {
				if err != nil {
					l.log.WarnContext(ctx, "committing revoked partitions failed; their new owner re-sends from the last commit", "err", err)
				}
			})
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range ps {
		for _, r := range p.recs {
			l.buffered -= r.bytes
		}
		p.recs = nil
		delete(l.parts, p.tp)
	}
	// Forget the revoked records' deliveries: queued ones are dropped, and a
	// parked stream's state is left to the markers (read again by whoever
	// owns the partition next).
	for _, s := range l.streams {
		s.fast = slices.DeleteFunc(s.fast, func(it *item) bool { return it.rec.part.revoked && !(s.sending && it == s.fast[0]) })
		s.toPG = slices.DeleteFunc(s.toPG, func(it *item) bool { return it.rec.part.revoked })
		l.schedule(s)
		l.forget(s)
	}
	l.idle.Broadcast()
	l.log.InfoContext(ctx, "partitions revoked", "partitions", gone, "committed", commit)
}

// sendingFrom reports a request in flight for a record of ps. l.mu held.
func (l *Lane) sendingFrom(ps []*partition) bool {
	for _, s := range l.streams {
		if s.sending && len(s.fast) > 0 && slices.Contains(ps, s.fast[0].rec.part) {
			return true
		}
	}
	return false
}
