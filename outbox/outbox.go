// Package outbox is the application side of Outbox Bridge: it writes events
// into bridge.outbox inside the caller's own transaction.
//
// Enqueue takes a pgx.Tx, not a pool, so the type itself says the event lands
// in the same transaction as the change it announces: emitting after a commit
// loses the event when the process dies between the two, and emitting before
// one announces a change that may still roll back.
//
// Ordering: events of one transaction are relayed in the order they were
// enqueued. Two transactions that enqueue for the same asset are serialised by
// a row lock on that asset's counter (held until commit), so per asset the
// relay order is the commit order and asset_seq has no gaps. The cost: writers
// of one asset wait for each other until commit. Enqueue one asset's events
// together, and in a transaction touching several assets, enqueue them in a
// stable order (EnqueueBatch sorts its lock order for you) to avoid deadlocks.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/outboxbridge/bridge/internal/eventbounds"
	"github.com/outboxbridge/bridge/internal/topicname"
	"github.com/outboxbridge/bridge/outbox/schema"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Event is one domain event.
type Event struct {
	// Topic is the Kafka topic. Required.
	Topic string
	// AssetID keys the event: events of one asset keep their order end to
	// end. "" is the null-asset stream (one ordered stream of its own).
	AssetID string
	// EventType names what happened, e.g. "asset.version_published". Required.
	EventType string
	// Payload is the event body; it must be valid JSON.
	Payload json.RawMessage
	// Headers are extra Kafka headers.
	Headers map[string]string
}

// ErrInvalidEvent is returned (wrapped) for an event that cannot be enqueued.
var ErrInvalidEvent = errors.New("invalid outbox event")

// Validator checks an event's payload against its topic's schema. A
// *schema.Registry is one.
type Validator interface {
	Validate(ctx context.Context, topic string, payload []byte) error
}

// Schemas, when set, validates every event before it is written: an event
// of a governed topic (docs/contract.md, "Schema-governed topics") whose
// payload does not match the topic's current schema is refused with an error
// wrapping ErrInvalidEvent and a *schema.ViolationError (schema, path, rule),
// and nothing is written. Set it once at start-up, before the first Enqueue:
//
//	reg, err := schema.New(schema.Config{URL: "http://127.0.0.1:8081/apis/ccompat/v7"})
//	...
//	outbox.Schemas = reg
//
// nil (the default) validates nothing here; the relay still validates and
// parks what does not match.
var Schemas Validator

// Logger receives the warning when a malformed trace context is dropped. It
// may be replaced by the application; nil disables the warning.
var Logger = slog.Default()

var traceparentRe = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// w3cTraceparent and w3cTracestate are the keys the W3C propagator writes,
// which the Kafka record and the webhook request carry under the same names.
// They are taken from the propagator rather than from internal/contract so
// that an application importing this package does not link the Kafka client;
// a test checks that the two agree.
var w3cTraceparent, w3cTracestate = func() (string, string) {
	f := propagation.TraceContext{}.Fields()
	return f[0], f[1]
}()

const enqueueSQL = `SELECT bridge.enqueue($1, $2, $3, $4::jsonb, $5::jsonb, $6, $7)`

// enqueueBatchSQL returns the ids in the order of the arrays.
const enqueueBatchSQL = `SELECT r.id FROM bridge.enqueue_batch($1::text[], $2::text[], $3::text[], $4::text[]::jsonb[], $5::text[]::jsonb[], $6::text[], $7::text[])
  WITH ORDINALITY AS r(id, n) ORDER BY r.n`

func (e Event) validate() error {
	switch {
	case e.Topic == "":
		return fmt.Errorf("%w: topic must not be empty", ErrInvalidEvent)
	case topicProblem(e.Topic) != "":
		t := e.Topic
		if len(t) > 300 {
			t = t[:300] + "…"
		}
		return fmt.Errorf("%w: topic %q is not a valid Kafka topic name: %s", ErrInvalidEvent, t, topicProblem(e.Topic))
	case e.EventType == "":
		return fmt.Errorf("%w: event type must not be empty", ErrInvalidEvent)
	case len(e.Payload) == 0:
		return fmt.Errorf("%w: payload must not be empty (use the JSON literal null)", ErrInvalidEvent)
	case !json.Valid(e.Payload):
		return fmt.Errorf("%w: payload is not valid JSON", ErrInvalidEvent)
	}
	// Every field that reaches an index has a bound (internal/eventbounds,
	// the same as bridge.check_event_bounds): past it the event would be
	// accepted here and refused by a later stage.
	if err := eventbounds.Check(e.Topic, e.AssetID, e.EventType, e.Headers); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	return nil
}

// checkSchema validates ev's payload with Schemas. A payload that does not
// match is the event's fault (ErrInvalidEvent); a registry that cannot be
// asked is not, and fails the call without saying the event is bad.
func checkSchema(ctx context.Context, ev Event) error {
	if Schemas == nil {
		return nil
	}
	err := Schemas.Validate(ctx, ev.Topic, ev.Payload)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, schema.ErrViolation):
		return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	default:
		return fmt.Errorf("enqueue: cannot validate the payload of topic %q: %w", ev.Topic, err)
	}
}

// topicProblem says what is wrong with a topic name, or "" when Kafka
// accepts it. A row whose topic Kafka refuses commits with the
// application's change and can never be sent: the relay parks it later, far
// from the code that wrote it.
func topicProblem(topic string) string { return topicname.Problem(topic) }

// Enqueue writes one event in tx and returns its id, the dedup id every copy
// of the event carries (Kafka header dedup-id, webhook-id). The W3C trace
// context of ctx (traceparent, tracestate) is stored with the event so the
// relay, the consumer and the webhook continue the caller's trace.
func Enqueue(ctx context.Context, tx pgx.Tx, ev Event) (uuid.UUID, error) {
	if err := ev.validate(); err != nil {
		return uuid.Nil, err
	}
	if err := checkSchema(ctx, ev); err != nil {
		return uuid.Nil, err
	}
	args, err := enqueueArgs(ctx, ev)
	if err != nil {
		return uuid.Nil, err
	}
	var id uuid.UUID
	if err := tx.QueryRow(ctx, enqueueSQL, args...).Scan(&id); err != nil {
		return uuid.Nil, fmt.Errorf("enqueue outbox event: %w", err)
	}
	return id, nil
}

// EnqueueBatch writes many events in tx in one round trip and returns their
// ids in the same order. Events of one asset keep their relative order. The
// per-asset locks are taken in a stable order (sorted asset ids) before any
// event is written, so two batches touching the same assets in different
// orders cannot deadlock each other. It is one statement
// (bridge.enqueue_batch, migration 00151) whatever the number of events:
// one bridge.enqueue call per event cost the writers most of their CPU.
func EnqueueBatch(ctx context.Context, tx pgx.Tx, events []Event) ([]uuid.UUID, error) {
	for i, ev := range events {
		if err := ev.validate(); err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		if err := checkSchema(ctx, ev); err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
	}
	if len(events) == 0 {
		return nil, nil
	}
	tp, ts := traceContext(ctx)
	topics := make([]string, len(events))
	assets := make([]*string, len(events))
	types := make([]string, len(events))
	payloads := make([]string, len(events))
	headers := make([]string, len(events))
	tps := make([]*string, len(events))
	tss := make([]*string, len(events))
	for i, ev := range events {
		hdr, err := headersJSON(ev)
		if err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		topics[i], types[i], payloads[i], headers[i], tps[i], tss[i] = ev.Topic, ev.EventType, string(ev.Payload), hdr, tp, ts
		if ev.AssetID != "" {
			assets[i] = &ev.AssetID
		}
	}
	rows, err := tx.Query(ctx, enqueueBatchSQL, topics, assets, types, payloads, headers, tps, tss)
	if err != nil {
		return nil, fmt.Errorf("enqueue outbox batch: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("enqueue outbox batch: %w", err)
	}
	if len(ids) != len(events) {
		return nil, fmt.Errorf("enqueue outbox batch: %d ids for %d events", len(ids), len(events))
	}
	return ids, nil
}

func headersJSON(ev Event) (string, error) {
	headers := ev.Headers
	if headers == nil {
		headers = map[string]string{}
	}
	hdr, err := json.Marshal(headers)
	if err != nil {
		return "", fmt.Errorf("%w: headers: %v", ErrInvalidEvent, err)
	}
	return string(hdr), nil
}

func enqueueArgs(ctx context.Context, ev Event) ([]any, error) {
	hdr, err := headersJSON(ev)
	if err != nil {
		return nil, err
	}
	var asset *string
	if ev.AssetID != "" {
		asset = &ev.AssetID
	}
	tp, ts := traceContext(ctx)
	return []any{ev.Topic, asset, ev.EventType, string(ev.Payload), hdr, tp, ts}, nil
}

// traceContext captures the caller's span context as W3C strings. A malformed
// one is dropped with a warning: a lost trace link must never fail a business
// transaction.
func traceContext(ctx context.Context) (traceparent, tracestate *string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil, nil
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	tp := carrier[w3cTraceparent]
	if !traceparentRe.MatchString(tp) {
		if Logger != nil {
			Logger.WarnContext(ctx, "dropping malformed traceparent", w3cTraceparent, tp)
		}
		return nil, nil
	}
	traceparent = &tp
	if s := carrier[w3cTracestate]; s != "" {
		tracestate = &s
	}
	return traceparent, tracestate
}
