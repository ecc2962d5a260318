package tracing

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/contract"
)

// w3c is used for stored trace context (outbox rows, delivery rows, Kafka
// headers). It is used directly rather than through otel's global propagator,
// so a stored traceparent travels even when no SDK is configured: the bridge
// must never be the hop that breaks a trace.
var w3c = propagation.TraceContext{}

// ContextWithRemoteParent returns ctx carrying the span context stored as a
// W3C traceparent/tracestate pair (ctx unchanged when traceparent is empty or
// invalid).
func ContextWithRemoteParent(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" {
		return ctx
	}
	carrier := propagation.MapCarrier{contract.HeaderTraceparent: traceparent}
	if tracestate != "" {
		carrier[contract.HeaderTracestate] = tracestate
	}
	return w3c.Extract(ctx, carrier)
}

// Traceparent returns the W3C traceparent and tracestate of the span context
// in ctx ("" when there is none).
func Traceparent(ctx context.Context) (traceparent, tracestate string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	carrier := propagation.MapCarrier{}
	w3c.Inject(ctx, carrier)
	return carrier[contract.HeaderTraceparent], carrier[contract.HeaderTracestate]
}

// TraceID returns the 32-hex trace id of ctx's span context, "" if none.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}
