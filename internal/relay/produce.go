package relay

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/tracing"
)

// Produce: the franz-go options, the Kafka record of a row and its PRODUCER
// span, and the sends themselves.

// ProducerOptions are the franz-go options the relay's client needs on top of
// the shared connection options (internal/kafkaclient).
func ProducerOptions(cfg Config) []kgo.Opt {
	cfg = cfg.WithDefaults()
	return []kgo.Opt{
		// acks=all with the idempotent producer (franz-go's default, stated
		// here because the guarantee depends on it): a broker ack means the
		// record is replicated, and retries cannot reorder or duplicate
		// within a partition.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// Java-compatible murmur2 on the key, so a Java or librdkafka
		// (murmur2_random) producer of the same asset lands on the same
		// partition. The null asset has an empty, non-nil key: hashed like
		// any key, so its stream stays on one partition and in order.
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		// Bound each attempt: franz-go retries retriable errors forever by
		// default, and a send that never returns can never be counted
		// (docs/failure-modes.md §4).
		kgo.RecordDeliveryTimeout(cfg.ProduceTimeout),
		// Without this, franz-go refuses to fail a record already in flight
		// (it cannot tell "never received" from "written, reply lost") and
		// waits for the broker to come back: with every broker gone the
		// relay would hang inside produce, never see the outage, and not
		// drain on SIGTERM. The price is a possible duplicate when the
		// record is sent again — the same dedup-id, which consumers dedup on.
		kgo.AllowIdempotentProduceCancellation(),
		kgo.ProduceRequestTimeout(min(cfg.ProduceTimeout, 30*time.Second)),
		// The relay waits for a whole batch of acks per cycle; a short linger
		// keeps the commit→ack latency low without giving up batching.
		kgo.ProducerLinger(2 * time.Millisecond),
		kgo.ProducerBatchMaxBytes(int32(max(cfg.MaxMessageBytes+4096, 1<<20))),
		kgo.MaxBufferedRecords(max(cfg.BatchSize*2, 10000)),
		// Let the broker decide: where auto.create.topics.enable is on, the
		// first event of a new topic creates it instead of failing
		// UNKNOWN_TOPIC_OR_PARTITION until the row is parked. Where it is
		// off, the row is charged and parked as usual.
		kgo.AllowAutoTopicCreation(),
	}
}

// sendResult is the outcome of producing one row.
type sendResult struct {
	partition int32
	offset    int64
	err       error
}

// record builds the Kafka record for w (docs/contract.md, "Kafka record")
// under the span context in ctx, which it carries into the producer's hooks.
func record(ctx context.Context, w *row, cloudEventsSource string) *kgo.Record {
	tp, ts := tracing.Traceparent(ctx)
	rec := contract.Encode(contract.Event{
		DedupID: w.ID.String(), Topic: w.Topic, AssetID: w.AssetID, AssetSeq: w.AssetSeq,
		EventType: w.EventType, Payload: []byte(w.Payload), Headers: w.Headers,
		TraceID: tracing.TraceID(ctx), Traceparent: tp, Tracestate: ts,
		CreatedAt: w.CreatedAt, CloudEventsSource: cloudEventsSource,
	})
	rec.Context = ctx
	return rec
}

// startSpan starts the PRODUCER span of one row, parented on the trace
// context stored with the row (the application's request), so the record
// continues that trace. A replayed row stays in its original trace.
func (r *Relay) startSpan(ctx context.Context, w *row) (context.Context, trace.Span) {
	parent := tracing.ContextWithRemoteParent(ctx, w.Traceparent, w.Tracestate)
	ctx, span := r.tracer.Start(parent, "publish "+w.Topic,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", w.Topic),
			attribute.String("messaging.message.id", w.ID.String()),
			attribute.String("messaging.kafka.message.key", w.AssetKey()),
			attribute.String("outbox.event_type", w.EventType),
			attribute.Int64("outbox.asset_seq", w.AssetSeq),
			attribute.Int("outbox.attempt", w.Attempts+1),
			attribute.Bool("outbox.replayed", w.Replayed),
		))
	if !span.SpanContext().IsValid() {
		// No SDK: the stored context must still travel in the headers.
		return parent, span
	}
	return ctx, span
}

func endSpan(span trace.Span, res sendResult) {
	if res.err != nil {
		span.RecordError(res.err)
		span.SetStatus(codes.Error, res.err.Error())
	} else {
		span.SetAttributes(
			attribute.Int("messaging.destination.partition.id", int(res.partition)),
			attribute.Int64("messaging.kafka.offset", res.offset))
	}
	span.End()
}

// setValue is the schema hook: with Config.Values set, the record's value
// is what it makes of the row's topic and payload (framed for a governed
// topic). Its error is the row's send result: a schema violation is poison
// (classify), a registry that cannot be asked is charged like a failed send.
func (r *Relay) setValue(ctx context.Context, rec *kgo.Record, w *row) error {
	if r.cfg.Values == nil {
		return nil
	}
	v, err := r.cfg.Values.Value(ctx, w.Topic, rec.Value)
	if err != nil {
		return err
	}
	rec.Value = v
	return nil
}

// produce sends rows[idx...] and waits for every acknowledgement. It
// returns when the last record was handed to the client.
func (r *Relay) produce(ctx context.Context, rows []*row, idx []int, results []sendResult) (buffered time.Time) {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.ProduceTimeout+5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(len(idx))
	for _, i := range idx {
		w := rows[i]
		sctx, span := r.startSpan(pctx, w)
		rec := record(sctx, w, r.cfg.CloudEventsSource)
		if err := r.setValue(sctx, rec, w); err != nil {
			results[i] = sendResult{err: err}
			endSpan(span, results[i])
			wg.Done()
			continue
		}
		r.client.Produce(pctx, rec, func(rec *kgo.Record, err error) {
			defer wg.Done()
			results[i] = sendResult{partition: rec.Partition, offset: rec.Offset, err: err}
			endSpan(span, results[i])
		})
	}
	buffered = time.Now()
	// The whole batch is buffered: send it now instead of after the linger.
	// The cycle waits for every ack anyway, and at a low rate (a few rows per
	// cycle) the linger was most of the commit→ack latency. An error here is
	// the context's, and every record's own result still arrives.
	_ = r.client.Flush(pctx)
	wg.Wait()
	return buffered
}

func (r *Relay) produceAlone(ctx context.Context, w *row) sendResult {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.ProduceTimeout+5*time.Second)
	defer cancel()
	sctx, span := r.startSpan(pctx, w)
	span.SetAttributes(attribute.Bool("outbox.resent_alone", true))
	rec := record(sctx, w, r.cfg.CloudEventsSource)
	if err := r.setValue(sctx, rec, w); err != nil {
		out := sendResult{err: err}
		endSpan(span, out)
		return out
	}
	res := r.client.ProduceSync(pctx, rec)
	out := sendResult{partition: rec.Partition, offset: rec.Offset, err: res.FirstErr()}
	endSpan(span, out)
	return out
}
