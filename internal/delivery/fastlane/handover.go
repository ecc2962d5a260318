package fastlane

import (
	"context"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/consumer"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/service"
)

// Hand-over: moving a parked stream's deliveries to the slow lane
// (bridge.deliveries), batched, in stream order.

// taken is one stream's share of a hand-over: the deliveries taken from
// its toPG, their rows, and the marker when this hand-over parks it.
type taken struct {
	s      *stream
	key    store.Stream
	items  []*item
	rows   []store.Parked
	marker *store.Marker
	// done: how many of items (from the front) are settled — written to
	// bridge.deliveries, or dead-lettered because PostgreSQL refuses them.
	done int
	// back: the marker was gone (the slow lane emptied the stream); the
	// items from done on go back to the fast lane.
	back bool
}

// handOverService writes parked streams' deliveries to bridge.deliveries,
// all the streams waiting in one transaction.
func (l *Lane) handOverService(ctx context.Context) {
	var last time.Time
	for {
		// One hand-over per HandOverInterval at most, of everything
		// queued meanwhile (see Config.HandOverInterval).
		if wait := l.cfg.HandOverInterval - time.Since(last); wait > 0 {
			service.Sleep(ctx, wait)
		}
		l.mu.Lock()
		for len(l.handQ) == 0 && ctx.Err() == nil {
			stop := context.AfterFunc(ctx, func() { l.mu.Lock(); l.hand.Broadcast(); l.mu.Unlock() })
			l.hand.Wait()
			stop()
		}
		if ctx.Err() != nil {
			l.mu.Unlock()
			return
		}
		batch := l.handQ
		l.handQ = nil
		var ts []*taken
		var held []*stream
		now := time.Now()
		for _, s := range batch {
			if s.park != nil && !l.parkSlot(s) || l.deferHandOver(s, now) {
				// Its subscription's fast-lane requests must first fit
				// in what the slow lane leaves them (see parkSlot), or
				// its endpoint fails and it had a hand-over just now
				// (see deferHandOver).
				held = append(held, s)
				continue
			}
			s.inHandQ = false
			var items []*item
			for _, it := range s.toPG {
				if !it.rec.part.revoked {
					items = append(items, it)
				}
			}
			s.toPG = nil
			if len(items) == 0 {
				l.forget(s)
				continue
			}
			s.handing = true
			t := &taken{s: s, key: store.Stream{SubscriptionID: s.key.sub, AssetKey: s.key.asset}, items: items}
			for i, it := range items {
				p := store.Parked{SubscriptionID: it.sub, Event: eventOf(it)}
				if s.park != nil && s.park.failure != nil {
					// The head carries the failed attempt; the rest of
					// the stream is not due before the head's retry
					// (see store.Parked.RetryIn).
					p.RetryIn = s.park.retryIn
					if i == 0 {
						f := s.park.failure.Outcome
						p.Attempts, p.StatusCode, p.Error = 1, f.StatusCode, f.Error
					}
				}
				t.rows = append(t.rows, p)
			}
			if s.park != nil {
				r := items[0].rec
				t.marker = &store.Marker{Stream: t.key, Topic: r.rec.Topic, Partition: r.rec.Partition, Offset: r.rec.Offset}
				s.park = nil
			}
			ts = append(ts, t)
		}
		for _, t := range ts {
			l.handedOver(t.s.key.sub, now)
		}
		if len(held) > 0 {
			l.handQ = append(l.handQ, held...)
			last = time.Now()
		}
		if len(ts) == 0 {
			l.mu.Unlock()
			continue
		}
		l.handing++
		l.mu.Unlock()
		last = time.Now()

		err := service.Retry(ctx, service.Wait{Name: "hand deliveries to the slow lane", Logger: l.log, LogEvery: 10 * time.Second},
			func(ctx context.Context) error {
				err := l.handOver(ctx, ts)
				if consumer.IsRecordFault(err) {
					// PostgreSQL refuses the data of some record (a \u0000
					// in its JSON, …): retrying the batch can never
					// succeed. Each stream is handed over alone, and in a
					// stream that is refused each delivery alone, so only
					// the offenders are dead-lettered.
					l.log.WarnContext(ctx, "PostgreSQL refused a hand-over; handing over stream by stream to isolate the record", "err", err)
					err = l.handOverIsolated(ctx, ts)
				}
				return err
			})

		l.mu.Lock()
		l.handGen++
		for _, t := range ts {
			s := t.s
			s.handing = false
			s.lastHand = l.handGen
			if err != nil {
				// Shutdown while PostgreSQL was unreachable: nothing settles,
				// the records are read again by the partition's next owner.
				l.forget(s)
				continue
			}
			for _, it := range t.items[:t.done] {
				l.settleItem(it)
			}
			l.stats.handedOver.Add(int64(t.done))
			if t.back {
				// The slow lane emptied the stream before these arrived:
				// they and whatever came meanwhile go out from here, in
				// order.
				s.parked = false
				delete(l.parkedKeys, s.key)
				s.fast = append(slices.Clone(t.items[t.done:]), s.toPG...)
				s.toPG = nil
				l.stats.unparked.Add(1)
				l.schedule(s)
			} else if len(s.toPG) > 0 && !s.inHandQ {
				s.inHandQ = true
				l.handQ = append(l.handQ, s)
			}
			l.forget(s)
		}
		l.handing--
		l.idle.Broadcast()
		l.mu.Unlock()
	}
}

// handOver writes every taken stream in one transaction.
func (l *Lane) handOver(ctx context.Context, ts []*taken) error {
	var markers []store.Marker
	var appends []store.Stream
	var rows []store.Parked
	for _, t := range ts {
		if t.marker != nil {
			markers = append(markers, *t.marker)
		} else {
			appends = append(appends, t.key)
		}
		rows = append(rows, t.rows...)
	}
	unparked, err := l.store.HandOver(ctx, markers, appends, rows)
	if err != nil {
		return err
	}
	back := make(map[store.Stream]bool, len(unparked))
	for _, u := range unparked {
		back[u] = true
	}
	for _, t := range ts {
		t.back = back[t.key]
		if !t.back {
			t.done = len(t.items)
		}
	}
	return nil
}

// handOverIsolated hands over each stream alone, and a stream PostgreSQL
// refuses one delivery at a time, dead-lettering the deliveries it refuses
// (a refused head's stream goes on with the next one, as after a death).
func (l *Lane) handOverIsolated(ctx context.Context, ts []*taken) error {
	for _, t := range ts {
		if t.done == len(t.items) || t.back {
			continue
		}
		err := l.handOver(ctx, []*taken{t})
		if !consumer.IsRecordFault(err) {
			if err != nil {
				return err
			}
			continue
		}
		for t.done < len(t.items) && !t.back {
			one := &taken{s: t.s, key: t.key, items: t.items[t.done : t.done+1], rows: t.rows[t.done : t.done+1], marker: t.marker}
			err := l.handOver(ctx, []*taken{one})
			switch {
			case consumer.IsRecordFault(err):
				if err := l.produceDeadLetters(ctx, []*kgo.Record{one.items[0].rec.rec},
					[]string{"PostgreSQL refused the record: " + err.Error()}); err != nil {
					return err
				}
				if t.marker != nil {
					// The stream stays parked without the refused row.
					if err := l.handOver(ctx, []*taken{{s: t.s, key: t.key, marker: t.marker}}); err != nil {
						return err
					}
				}
			case err != nil:
				return err
			case one.back:
				t.back = true
				continue
			}
			t.marker = nil // written: the rest are appends
			t.done++
		}
	}
	return nil
}

func eventOf(it *item) store.Event {
	m := &it.rec.msg
	return store.Event{
		ID: m.DedupID, Type: m.EventType, Topic: it.rec.rec.Topic, AssetID: m.AssetID, AssetSeq: m.AssetSeq,
		Payload: string(m.Payload), CreatedAt: m.CreatedAt, Traceparent: m.Traceparent, Tracestate: m.Tracestate,
	}
}
