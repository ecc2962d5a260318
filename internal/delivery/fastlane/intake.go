package fastlane

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/service"
)

// Intake: polling the owned partitions, decoding each record and fanning it
// out to the streams of the subscriptions it matches; records that cannot be
// decoded go to the dead-letter topic.

// poll reads records until ctx ends.
func (l *Lane) poll(ctx context.Context) {
	for {
		// The memory bound: no poll while the records held pass it.
		l.mu.Lock()
		for l.buffered > l.cfg.MaxBufferedBytes && ctx.Err() == nil {
			stop := context.AfterFunc(ctx, func() { l.mu.Lock(); l.idle.Broadcast(); l.mu.Unlock() })
			l.waitIdle()
			stop()
		}
		l.mu.Unlock()
		fetches := l.client.PollRecords(ctx, 1000)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			l.client.AllowRebalance()
			return
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			l.log.WarnContext(ctx, "fetch failed", "topic", topic, "partition", partition, "err", err)
		})
		recs := fetches.Records()
		if len(recs) > 0 {
			l.stats.polls.Add(1)
		}
		decoded, ok := l.decode(ctx, recs)
		if !ok {
			l.client.AllowRebalance()
			return
		}
		// The routes must be as new as the newest event polled (see
		// awaitRoutes); the end offsets go in first, so records waiting
		// for a check count as lag, not as a lane with nothing to do.
		if newest := newestEvent(decoded); newest.UnixNano() > l.routesAsOf.Load() {
			l.mu.Lock()
			l.noteEnds(fetches)
			l.mu.Unlock()
			l.awaiting.Store(int64(len(recs)))
			err := l.awaitRoutes(ctx, newest)
			l.awaiting.Store(0)
			if err != nil {
				l.client.AllowRebalance()
				return
			}
		}
		var bad []*kgo.Record
		l.mu.Lock()
		l.noteEnds(fetches)
		for i, r := range recs {
			if !l.take(r, decoded[i]) {
				bad = append(bad, r)
			}
		}
		l.mu.Unlock()
		if len(bad) > 0 {
			l.deadLetter(ctx, bad)
		}
		l.client.AllowRebalance()
	}
}

// noteEnds records each partition's end offset from a fetch. l.mu held.
func (l *Lane) noteEnds(fetches kgo.Fetches) {
	fetches.EachPartition(func(f kgo.FetchTopicPartition) {
		if p := l.parts[topicPartition{f.Topic, f.Partition}]; p != nil && f.Err == nil {
			p.highWatermark = f.HighWatermark
		}
	})
}

// newestEvent is the latest event time among decoded records (the
// created-at header, else the record's timestamp; see contract.Message).
func newestEvent(decoded []decodedRecord) time.Time {
	var newest time.Time
	for i := range decoded {
		if d := &decoded[i]; d.err == nil && d.msg.CreatedAt.After(newest) {
			newest = d.msg.CreatedAt
		}
	}
	return newest
}

// decodedRecord is a record read by contract.DecodeWith: err is nil or a
// *contract.DecodeError (the record is dead-lettered).
type decodedRecord struct {
	msg contract.Message
	err error
}

// decode reads recs outside the lane's lock. A schema registry that cannot
// answer holds the poll (the partitions' offsets stay where they are and
// /readyz reports the stall) instead of dead-lettering records that are
// fine; ok is false when ctx ended meanwhile.
func (l *Lane) decode(ctx context.Context, recs []*kgo.Record) (out []decodedRecord, ok bool) {
	out = make([]decodedRecord, len(recs))
	for i, r := range recs {
		err := service.Retry(ctx, service.Wait{Name: "decode with the schema registry", Logger: l.log, LogEvery: 10 * time.Second},
			func(ctx context.Context) error {
				m, err := contract.DecodeWith(ctx, r, l.cfg.Values)
				var de *contract.DecodeError
				if err == nil || errors.As(err, &de) {
					out[i] = decodedRecord{m, err}
					return nil
				}
				return err
			})
		if err != nil {
			return nil, false
		}
	}
	return out, true
}

// take routes one record (l.mu held). It reports false for a record that
// cannot be read: the caller dead-letters it, then settles it.
func (l *Lane) take(r *kgo.Record, d decodedRecord) bool {
	p := l.parts[topicPartition{r.Topic, r.Partition}]
	if p == nil || p.revoked {
		return true // not ours (any more): its new owner reads it
	}
	if n := len(p.recs); n > 0 && r.Offset <= p.recs[n-1].rec.Offset {
		return true // already held
	}
	p.next = r.Offset + 1
	msg, err := d.msg, d.err
	rec := &record{part: p, rec: r, msg: msg, bytes: int64(len(r.Value) + len(r.Key) + 200), polled: time.Now()}
	p.recs = append(p.recs, rec)
	l.buffered += rec.bytes
	l.stats.records.Add(1)
	var de *contract.DecodeError
	if errors.As(err, &de) {
		rec.pending = 1 // settled once dead-lettered
		return false
	}
	if msg.DedupID == p.lastDedup {
		l.stats.duplicates.Add(1)
		return true
	}
	p.lastDedup = msg.DedupID
	asset := assetKey(&msg)
	for i := range l.routes {
		rt := &l.routes[i]
		if !rt.filter.Matches(r.Topic, msg.EventType) {
			continue
		}
		rec.pending++
		s := l.stream(streamKey{rt.ID, asset})
		it := &item{rec: rec, sub: rt.ID}
		rec.items = append(rec.items, it)
		l.wait(p, it)
		switch {
		case s.parked:
			l.toSlowLane(s, it)
		case !s.sending && len(s.fast) == 0 && p.isolated[rt.ID].After(rec.polled):
			// The subscription is isolated on this partition: a stream of
			// it that is idle here starts in the slow lane.
			s.parked = true
			s.park = &parkInfo{}
			l.toSlowLane(s, it)
		case rt.RateLimit > 0:
			// A rate limit holds across every replica only where one place
			// counts: the slow lane's token bucket in bridge.subscriptions.
			s.parked = true
			s.park = &parkInfo{}
			l.toSlowLane(s, it)
		default:
			s.fast = append(s.fast, it)
			l.schedule(s)
		}
	}
	return true
}

// assetKey is the stream's asset key: coalesce(asset_id, ”).
func assetKey(m *contract.Message) string {
	if m.AssetID == nil {
		return ""
	}
	return *m.AssetID
}

// waitIdle waits on l.idle, counted in l.idleWaiters. l.mu held.
func (l *Lane) waitIdle() {
	l.idleWaiters++
	l.idle.Wait()
	l.idleWaiters--
}

// deadLetter produces unreadable records to "<topic>.dlq" (as the consumer
// does), retrying until acknowledged, then settles them.
func (l *Lane) deadLetter(ctx context.Context, bad []*kgo.Record) {
	reasons := make([]string, len(bad))
	for i, r := range bad {
		_, err := contract.DecodeWith(ctx, r, l.cfg.Values)
		reasons[i] = err.Error()
	}
	err := service.Retry(ctx, service.Wait{Name: "produce dead letters", Logger: l.log, LogEvery: 10 * time.Second},
		func(ctx context.Context) error { return l.produceDeadLetters(ctx, bad, reasons) })
	if err != nil {
		return // shutdown: not settled, read again
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range bad {
		if p := l.parts[topicPartition{r.Topic, r.Partition}]; p != nil {
			for _, rec := range p.recs {
				if rec.rec == r {
					l.settle(rec)
				}
			}
		}
	}
}

// produceDeadLetters produces recs to "<topic>.dlq" with the consumer's
// headers and waits for the acknowledgements.
func (l *Lane) produceDeadLetters(ctx context.Context, recs []*kgo.Record, reasons []string) error {
	out := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		hs := append(slices.Clone(r.Headers),
			kgo.RecordHeader{Key: contract.HeaderDLQReason, Value: []byte(reasons[i])},
			kgo.RecordHeader{Key: contract.HeaderDLQTopic, Value: []byte(r.Topic)},
			kgo.RecordHeader{Key: contract.HeaderDLQPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
			kgo.RecordHeader{Key: contract.HeaderDLQOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
		)
		out[i] = &kgo.Record{Topic: r.Topic + contract.DeadLetterSuffix, Key: r.Key, Value: r.Value, Headers: hs, Timestamp: r.Timestamp}
		l.log.WarnContext(ctx, "record dead-lettered", "reason", reasons[i], "topic", r.Topic, "partition", r.Partition, "offset", r.Offset)
	}
	if err := l.client.ProduceSync(ctx, out...).FirstErr(); err != nil {
		return err
	}
	l.stats.deadLettered.Add(int64(len(out)))
	return nil
}
