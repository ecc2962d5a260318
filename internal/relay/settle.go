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

// settlement is the bookkeeping of one produced batch: which held rows went
// out, which rows to hold, park or charge, and the lanes' positions to save.
// It is written while the next batch is read and produced, at most one at a
// time, in order.
type settlement struct {
	// before is the read state before the batch was read: restored if the
	// settlement cannot be written.
	before    *checkpoint
	rows      []*row
	results   []sendResult
	sent      []int
	park      []int
	charge    []int
	oversized []int
	// hold: log rows the claim held behind their asset's held rows.
	hold []*row
	// unsettled holds the assets with a failed row in the batch. Their hold
	// is not written yet, so the next batch must hold their later rows too.
	unsettled map[string]bool
	// save: lanes' positions to save once the outcomes are written (nil:
	// none this time).
	save []positionSave
	done chan struct{}
	err  error
	took time.Duration // writing it (valid once done is closed)
}

// write records the outcomes, then the positions. Every statement is fenced
// by the lane lease. Every log row of the batch that did not go out is held
// (copied into bridge.outbox_held): charged, parked, or uncharged behind its
// asset's failing row; the position then moves past it.
func (s *settlement) write(ctx context.Context, r *Relay) error {
	o := outboxstore.Outcomes{MaxAttempts: r.cfg.MaxAttempts, Announce: r.announce()}
	sent := map[int]bool{}
	for _, i := range s.sent {
		sent[i] = true
		if s.rows[i].Held {
			o.Sent = append(o.Sent, s.rows[i].ID)
		}
	}
	for _, w := range s.hold {
		o.Hold = append(o.Hold, w.ID)
	}
	for i, w := range s.rows {
		if !sent[i] && !w.Held {
			o.Hold = append(o.Hold, w.ID)
		}
	}
	reasons := map[int]string{}
	for _, i := range s.park {
		reasons[i] = fmt.Sprintf("not retriable (record of %d bytes): %v", s.rows[i].PayloadBytes, s.results[i].err)
	}
	for _, i := range s.oversized {
		reasons[i] = tooLargeReason(s.rows[i], r.cfg.MaxMessageBytes)
	}
	parks := append(slices.Clone(s.park), s.oversized...)
	for _, i := range parks {
		o.Parks = append(o.Parks, outboxstore.Park{ID: s.rows[i].ID, Reason: reasons[i]})
	}
	errOf := map[uuid.UUID]string{}
	for _, i := range s.charge {
		w := s.rows[i]
		c := outboxstore.Charge{ID: w.ID, Err: s.results[i].err.Error(), DelayMs: r.backoff(w.Attempts + 1).Milliseconds()}
		o.Charges = append(o.Charges, c)
		errOf[w.ID] = c.Err
	}
	qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	charged, err := outboxstore.WriteOutcomes(qctx, r.pool, r.cfg.MemberID, o)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, i := range s.sent {
		r.cfg.Metrics.Produced(s.rows[i].Topic, now.Sub(s.rows[i].CreatedAt))
	}
	r.reportParked(ctx, s.rows, parks, reasons)
	r.reportCharged(ctx, s.rows, s.charge, charged, errOf)
	for _, p := range s.save {
		if _, err := outboxstore.SavePosition(qctx, r.pool, r.cfg.MemberID, p.server, p.lanes, p.pos); err != nil {
			return err
		}
	}
	return nil
}

// positionSave is a group's position to save, read from server (see
// forgetPositions).
type positionSave struct {
	lanes  []int
	pos    outboxstore.Position
	server string
}

// positionEvery: how often at most the relay saves its lanes' positions.
// The position is its only write on the happy path (one row per lane); a
// relay that stops without saving leaves its lanes to read at most this
// much again (the same dedup-ids). Saved at once when lanes are released.
const positionEvery = time.Second

// positionsToSave returns the groups' positions to save with this cycle's
// settlement, every positionEvery.
func (r *Relay) positionsToSave() []positionSave {
	if time.Since(r.savedAt) < positionEvery {
		return nil
	}
	r.savedAt = time.Now()
	return r.positionsNow()
}

// positionsNow returns every group's position.
func (r *Relay) positionsNow() []positionSave {
	var out []positionSave
	for _, g := range r.groups {
		if p := g.position(); p != g.saved {
			out = append(out, positionSave{lanes: slices.Clone(g.lanes), pos: p, server: r.server})
			g.saved = p
		}
	}
	return out
}

// unsavedPositions says whether a group's position moved since it was last
// handed to a save.
func (r *Relay) unsavedPositions() bool {
	for _, g := range r.groups {
		if g.position() != g.saved {
			return true
		}
	}
	return false
}

// savePositionsNow saves every group's position (before lanes are released:
// the next owner starts where this one stopped). Call it with nothing in
// flight.
func (r *Relay) savePositionsNow(ctx context.Context) {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), database.QueryTimeout)
	defer cancel()
	r.savedAt = time.Now()
	for _, p := range r.positionsNow() {
		if _, err := outboxstore.SavePosition(qctx, r.pool, r.cfg.MemberID, p.server, p.lanes, p.pos); err != nil {
			r.log.WarnContext(ctx, "save lane positions", "error", err)
			return
		}
	}
}

func tooLargeReason(w *row, limit int) string {
	return fmt.Sprintf("payload is %d bytes, over RELAY_MAX_MESSAGE_BYTES=%d", w.PayloadBytes, limit)
}

// backoff returns the delay before the attempt after `attempts` failures:
// BackoffBase·2^(attempts-1), capped, with ±10% jitter so rows that failed
// together do not retry in lockstep.
func (r *Relay) backoff(attempts int) time.Duration {
	return service.Backoff{Base: r.cfg.BackoffBase, Max: r.cfg.BackoffMax, Jitter: 0.1}.Delay(attempts)
}

func (r *Relay) reportCharged(ctx context.Context, rows []*row, idx []int, charged []outboxstore.Charged, errOf map[uuid.UUID]string) {
	byID := map[uuid.UUID]*row{}
	for _, i := range idx {
		byID[rows[i].ID] = rows[i]
	}
	for _, c := range charged {
		w := byID[c.ID]
		if w == nil {
			continue
		}
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
}

// announce is how a parked row is announced (OperationsTopic "": not).
func (r *Relay) announce() outboxstore.Announce {
	if r.cfg.OperationsTopic == "" {
		return outboxstore.Announce{}
	}
	return outboxstore.Announce{Topic: r.cfg.OperationsTopic, EventType: contract.OpOutboxFailed,
		AssetPrefix: contract.OperationsAssetForTopic(""), Skip: contract.OperationTypes()}
}

func (r *Relay) reportParked(ctx context.Context, rows []*row, idx []int, reasons map[int]string) {
	for _, i := range idx {
		w := rows[i]
		lctx := tracing.ContextWithRemoteParent(ctx, w.Traceparent, w.Tracestate)
		r.cfg.Metrics.Parked(w.Topic, "poison")
		r.spanEvent(lctx, w, "outbox.parked", reasons[i])
		r.log.ErrorContext(lctx, "outbox row parked as FAILED: retrying cannot fix it",
			"dedup_id", w.ID, "topic", w.Topic, "asset_id", w.AssetKey(), "reason", reasons[i])
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
