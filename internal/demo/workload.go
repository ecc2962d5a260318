package demo

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/fnv"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/outboxbridge/bridge/outbox"
)

// Event types of the workload: what an asset service announces.
const (
	typeUploaded         = "asset.uploaded"
	typeMetadataUpdated  = "asset.metadata_updated"
	typeVersionPublished = "asset.version_published"
	typeVersionExpired   = "asset.version_expired"
	typeDeleted          = "asset.deleted"
	typeRenditionReady   = "asset.rendition_ready" // the poison event
	typeCatalogReindexed = "catalog.reindexed"     // null-asset stream
)

// tx is one transaction of the workload: the events it enqueues together.
type tx struct {
	name   string // what it does, for its span: "publish v3, expire v2"
	asset  string // "" for the null-asset stream
	events []outbox.Event
	poison bool
}

// MinEvents is the smallest workload that still contains every step of the
// lifecycle (uploads, a publish-and-expire, a deletion, null-asset events and
// the poison event).
const MinEvents = 20

// plan builds the workload: events events over assets assets, in the order an
// asset service would write them. It is deterministic for a seed.
//
//   - every asset is uploaded first (asset.uploaded, v1);
//   - then, on random live assets: "publish v(n+1) and expire v(n)" in ONE
//     transaction (half the time), or a lone metadata update or publish;
//   - a few null-asset events (catalog.reindexed) spread through the run;
//   - one poison event (a payload of poisonBytes, over
//     RELAY_MAX_MESSAGE_BYTES) a quarter of the way in, on the last asset,
//     which keeps receiving events after it: a parked row holds nothing back;
//   - the last events delete a tenth of the assets (at least one).
func plan(topic, runID string, events, assets, poisonBytes int, seed uint64) []tx {
	rng := mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ids := make([]string, assets)
	version := make([]int, assets)
	for i := range ids {
		ids[i] = fmt.Sprintf("asset-%04d", i)
	}
	headers := map[string]string{"demo-run": runID}
	ev := func(asset, typ string, payload any) outbox.Event {
		b, _ := json.Marshal(payload)
		return outbox.Event{Topic: topic, AssetID: asset, EventType: typ, Payload: b, Headers: headers}
	}

	nullEvents := max(3, events/100)
	deletions := max(1, assets/10)
	middle := events - assets - deletions - nullEvents - 1
	var out []tx
	for i, id := range ids {
		version[i] = 1
		out = append(out, tx{name: "upload", asset: id, events: []outbox.Event{
			ev(id, typeUploaded, map[string]any{"asset": id, "version": 1, "bytes": 1 << (10 + rng.IntN(12))}),
		}})
	}

	poisonAt := middle / 4
	nullEvery := max(1, middle/nullEvents)
	nulls := 0
	for spent := 0; spent < middle; {
		if spent >= poisonAt && poisonAt >= 0 {
			poisonAt = -1
			id := ids[assets-1]
			out = append(out, tx{name: "poison rendition", asset: id, poison: true, events: []outbox.Event{
				ev(id, typeRenditionReady, map[string]any{"asset": id, "rendition": incompressible(poisonBytes)}),
			}})
			continue
		}
		if nulls < nullEvents && spent >= nulls*nullEvery {
			nulls++
			out = append(out, tx{name: "reindex catalog", events: []outbox.Event{
				ev("", typeCatalogReindexed, map[string]any{"assets": assets, "pass": nulls}),
			}})
			continue
		}
		// Only assets that will not be deleted get middle events, so the
		// deletions at the end stay the last event of their asset.
		var i int
		if assets > deletions {
			i = deletions + rng.IntN(assets-deletions)
		} else {
			i = rng.IntN(assets) // one asset: it is also the one deleted, last
		}
		id := ids[i]
		switch r := rng.IntN(10); {
		case r < 5 && middle-spent >= 2:
			version[i]++
			out = append(out, tx{name: fmt.Sprintf("publish v%d, expire v%d", version[i], version[i]-1), asset: id, events: []outbox.Event{
				ev(id, typeVersionPublished, map[string]any{"asset": id, "version": version[i]}),
				ev(id, typeVersionExpired, map[string]any{"asset": id, "version": version[i] - 1}),
			}})
			spent += 2
		case r < 8:
			out = append(out, tx{name: "update metadata", asset: id, events: []outbox.Event{
				ev(id, typeMetadataUpdated, map[string]any{"asset": id, "title": fmt.Sprintf("%s rev %d", id, rng.IntN(1000))}),
			}})
			spent++
		default:
			version[i]++
			out = append(out, tx{name: fmt.Sprintf("publish v%d", version[i]), asset: id, events: []outbox.Event{
				ev(id, typeVersionPublished, map[string]any{"asset": id, "version": version[i]}),
			}})
			spent++
		}
	}
	for ; nulls < nullEvents; nulls++ {
		out = append(out, tx{name: "reindex catalog", events: []outbox.Event{
			ev("", typeCatalogReindexed, map[string]any{"assets": assets, "pass": nulls + 1}),
		}})
	}
	for i := range deletions {
		out = append(out, tx{name: "delete", asset: ids[i], events: []outbox.Event{
			ev(ids[i], typeDeleted, map[string]any{"asset": ids[i], "last_version": version[i]}),
		}})
	}
	return out
}

// incompressible returns n characters of base64 over random bytes: franz-go
// compresses batches, and a broker's size limit applies after compression, so
// a poison made of repeated bytes would not be poison at all.
func incompressible(n int) string {
	b := make([]byte, n*3/4+3)
	_, _ = rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)[:n]
}

// committed is what the workload knows about one enqueued event.
type committed struct {
	at      time.Time // when its transaction's COMMIT returned
	traceID string    // the trace it was enqueued in
	poison  bool
}

// player enqueues a plan at a rate and records when each event committed.
type player struct {
	pool     *pgxpool.Pool
	tracer   trace.Tracer
	rate     float64
	duration time.Duration
	writers  int

	enqueued     atomic.Int64
	transactions atomic.Int64
	poisoned     atomic.Int64

	mu      sync.Mutex
	commits map[string]committed // event id → commit
	sample  string               // trace id of the first publish-and-expire transaction
}

// play enqueues txs until all are committed, ctx ends or the duration cap
// passes. One asset always goes through the same writer, so its events are
// committed in the plan's order; different assets are written concurrently.
func (p *player) play(ctx context.Context, txs []tx) error {
	if p.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.duration)
		defer cancel()
	}
	queues := make([]chan tx, p.writers)
	for i := range queues {
		queues[i] = make(chan tx, 64)
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, q := range queues {
		g.Go(func() error {
			for t := range q {
				if err := p.write(gctx, t); err != nil {
					if gctx.Err() != nil {
						return nil // stopped: the transaction rolled back, nothing half-written
					}
					return err
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		defer func() {
			for _, q := range queues {
				close(q)
			}
		}()
		start := time.Now()
		sent := 0
		for _, t := range txs {
			if p.rate > 0 {
				due := start.Add(time.Duration(float64(sent) / p.rate * float64(time.Second)))
				if wait := time.Until(due); wait > 0 {
					select {
					case <-gctx.Done():
						return nil
					case <-time.After(wait):
					}
				}
			}
			select {
			case <-gctx.Done():
				return nil
			case queues[writerOf(t.asset, p.writers)] <- t:
			}
			sent += len(t.events)
		}
		return nil
	})
	return g.Wait()
}

func writerOf(asset string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(asset))
	return int(h.Sum32() % uint32(n))
}

// write commits one transaction of the plan inside its own span, so every
// event carries the trace of the "request" that caused it.
func (p *player) write(ctx context.Context, t tx) error {
	ctx, span := p.tracer.Start(ctx, "demo "+t.name, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("asset.id", t.asset), attribute.Int("events", len(t.events))))
	defer span.End()
	if !span.SpanContext().IsValid() {
		// No tracer: each transaction still gets a trace context, so
		// trace continuity is checked all the same.
		ctx = trace.ContextWithSpanContext(ctx, syntheticSpanContext())
	}
	var ids []string
	err := pgx.BeginFunc(ctx, p.pool, func(dbtx pgx.Tx) error {
		got, err := outbox.EnqueueBatch(ctx, dbtx, t.events)
		if err != nil {
			return err
		}
		ids = make([]string, len(got))
		for i, id := range got {
			ids[i] = id.String()
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("enqueue %s: %w", t.name, err)
	}
	now := time.Now()
	traceID := trace.SpanContextFromContext(ctx).TraceID().String()
	p.mu.Lock()
	for _, id := range ids {
		p.commits[id] = committed{at: now, traceID: traceID, poison: t.poison}
	}
	if p.sample == "" && len(t.events) == 2 {
		p.sample = traceID
	}
	p.mu.Unlock()
	p.enqueued.Add(int64(len(ids)))
	p.transactions.Add(1)
	if t.poison {
		p.poisoned.Add(1)
	}
	return nil
}

// syntheticSpanContext stands in for the caller's trace when no tracer
// records: the bridge stores and forwards a W3C traceparent whether or not
// anything exports spans, and the receiver checks it arrives intact.
func syntheticSpanContext() trace.SpanContext {
	var tid trace.TraceID
	var sid trace.SpanID
	_, _ = rand.Read(tid[:])
	_, _ = rand.Read(sid[:])
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, Remote: true})
}

func (p *player) snapshot() map[string]committed {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]committed, len(p.commits))
	for k, v := range p.commits {
		out[k] = v
	}
	return out
}
