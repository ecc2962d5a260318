package relay

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/outboxstore"
	"github.com/outboxbridge/bridge/internal/service"
	"github.com/outboxbridge/bridge/internal/tracing"
)

// Settlement: the bookkeeping of a produced batch — marks, charges, parks —
// written through outboxstore, fenced by the lane lease.

// settlement is the bookkeeping of one produced batch: which rows to mark
// SENT, park or charge. It is written while the next batch is claimed and
// produced (the marks are the slowest step of a cycle), at most one at a time.
type settlement struct {
	rows      []*row
	results   []sendResult
	sent      []int
	park      []int
	charge    []int
	oversized []int
	// seqs of every row of the batch: they are still NEW until the
	// settlement is written, so the next claim must skip them.
	seqs []int64
	// unsettled holds the assets with a failed row in the batch. Their hold
	// (next_attempt_at) is not written yet, so the next batch must not carry
	// their later rows.
	unsettled map[string]bool
	done      chan struct{}
	err       error
	took      time.Duration // writing it (valid once done is closed)
}

// write records the outcomes. Marks are fenced by the lane lease.
func (s *settlement) write(ctx context.Context, r *Relay) error {
	if err := r.markSent(ctx, s.rows, s.sent, s.results); err != nil {
		return err
	}
	if len(s.park)+len(s.oversized) > 0 {
		reasons := map[int]string{}
		for _, i := range s.park {
			reasons[i] = fmt.Sprintf("not retriable (record of %d bytes): %v", s.rows[i].PayloadBytes, s.results[i].err)
		}
		for _, i := range s.oversized {
			reasons[i] = tooLargeReason(s.rows[i], r.cfg.MaxMessageBytes)
		}
		r.park(ctx, s.rows, append(slices.Clone(s.park), s.oversized...), func(i int) string { return reasons[i] })
	}
	if len(s.charge) > 0 {
		return r.charge(ctx, s.rows, s.charge, s.results)
	}
	return nil
}
func tooLargeReason(w *row, limit int) string {
	return fmt.Sprintf("payload is %d bytes, over RELAY_MAX_MESSAGE_BYTES=%d", w.PayloadBytes, limit)
}

func (r *Relay) markSent(ctx context.Context, rows []*row, idx []int, results []sendResult) error {
	if len(idx) == 0 {
		return nil
	}
	acks := make([]outboxstore.Ack, len(idx))
	for j, i := range idx {
		acks[j] = outboxstore.Ack{Seq: rows[i].Seq, Partition: results[i].partition, Offset: results[i].offset}
	}
	qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	n, err := outboxstore.MarkSent(qctx, r.pool, r.cfg.MemberID, acks)
	if err != nil {
		// The rows stay NEW and will be produced again with the same
		// dedup-id: at least once, never lost.
		return err
	}
	if n < int64(len(idx)) {
		r.log.WarnContext(ctx, "lane lease lost while rows were in flight; another replica will mark them",
			"acked", len(idx), "marked", n)
	}
	now := time.Now()
	for _, i := range idx {
		r.cfg.Metrics.Produced(rows[i].Topic, now.Sub(rows[i].CreatedAt))
	}
	return nil
}

// backoff returns the delay before the attempt after `attempts` failures:
// BackoffBase·2^(attempts-1), capped, with ±10% jitter so rows that failed
// together do not retry in lockstep.
func (r *Relay) backoff(attempts int) time.Duration {
	return service.Backoff{Base: r.cfg.BackoffBase, Max: r.cfg.BackoffMax, Jitter: 0.1}.Delay(attempts)
}

func (r *Relay) charge(ctx context.Context, rows []*row, idx []int, results []sendResult) error {
	charges := make([]outboxstore.Charge, len(idx))
	byID := map[uuid.UUID]*row{}
	errOf := map[uuid.UUID]string{}
	for j, i := range idx {
		w := rows[i]
		charges[j] = outboxstore.Charge{ID: w.ID, Err: results[i].err.Error(), DelayMs: r.backoff(w.Attempts + 1).Milliseconds()}
		byID[w.ID], errOf[w.ID] = w, charges[j].Err
	}
	qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	charged, err := outboxstore.ChargeAttempts(qctx, r.pool, r.cfg.MemberID, charges, r.cfg.MaxAttempts, r.announce())
	if err != nil {
		return err
	}
	for _, c := range charged {
		w := byID[c.ID]
		r.cfg.Metrics.AttemptCharged(w.Topic)
		lctx := tracing.ContextWithRemoteParent(ctx, w.Traceparent, w.Tracestate)
		if c.Status == "FAILED" {
			r.cfg.Metrics.Parked(w.Topic, "exhausted")
			r.spanEvent(lctx, w, "outbox.parked", "attempts exhausted")
			r.log.ErrorContext(lctx, "outbox row parked as FAILED after its last attempt",
				"dedup_id", c.ID, "topic", w.Topic, "asset_id", w.AssetKey(), "attempts", c.Attempts, "error", errOf[c.ID])
		} else {
			r.log.WarnContext(lctx, "produce failed; will retry",
				"dedup_id", c.ID, "topic", w.Topic, "asset_id", w.AssetKey(), "attempts", c.Attempts, "error", errOf[c.ID])
		}
	}
	return nil
}

// announce is how a parked row is announced (OperationsTopic "": not).
func (r *Relay) announce() outboxstore.Announce {
	if r.cfg.OperationsTopic == "" {
		return outboxstore.Announce{}
	}
	return outboxstore.Announce{Topic: r.cfg.OperationsTopic, EventType: contract.OpOutboxFailed,
		AssetPrefix: contract.OperationsAssetForTopic(""), Skip: contract.OperationTypes()}
}

func (r *Relay) park(ctx context.Context, rows []*row, idx []int, reason func(i int) string) {
	parks := make([]outboxstore.Park, len(idx))
	reasons := make([]string, len(idx))
	for j, i := range idx {
		reasons[j] = reason(i)
		parks[j] = outboxstore.Park{ID: rows[i].ID, Reason: reasons[j]}
	}
	qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	if err := outboxstore.ParkRows(qctx, r.pool, r.cfg.MemberID, parks, r.announce()); err != nil {
		r.log.ErrorContext(ctx, "park outbox rows", "error", err)
		return
	}
	for j, i := range idx {
		w := rows[i]
		lctx := tracing.ContextWithRemoteParent(ctx, w.Traceparent, w.Tracestate)
		r.cfg.Metrics.Parked(w.Topic, "poison")
		r.spanEvent(lctx, w, "outbox.parked", reasons[j])
		r.log.ErrorContext(lctx, "outbox row parked as FAILED: retrying cannot fix it",
			"dedup_id", w.ID, "topic", w.Topic, "asset_id", w.AssetKey(), "reason", reasons[j])
	}
}

// spanEvent records a parked row in its trace: a short span with an event,
// so the trace in Jaeger shows where the event stopped.
func (r *Relay) spanEvent(ctx context.Context, w *row, name, reason string) {
	_, span := r.tracer.Start(ctx, "park "+w.Topic, trace.WithAttributes(
		attribute.String("messaging.message.id", w.ID.String())))
	span.AddEvent(name, trace.WithAttributes(attribute.String("reason", reason)))
	span.SetStatus(codes.Error, reason)
	span.End()
}
