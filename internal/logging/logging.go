// Package logging builds the bridge's slog logger. Every record written with a
// context carries the trace_id and span_id of the span in that context, so an
// operator can go from a log line to the trace in Jaeger and back.
package logging

import (
	"context"
	"io"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// New returns a logger writing text or JSON to w at the given level.
func New(w io.Writer, level, format string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: ParseLevel(level), ReplaceAttr: durationsAsText}
	var h slog.Handler
	if format == "json" {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = slog.NewTextHandler(w, opts)
	}
	return slog.New(&traceHandler{Handler: h})
}

// durationsAsText writes every time.Duration as Go duration text ("1s",
// "250ms"). slog's JSON handler writes a Duration as integer nanoseconds
// ("poll_interval":1000000000), which nobody reads as a second and which
// disagreed with the text format's "1s". A value meant for arithmetic is
// logged as a number under a key ending in _seconds instead.
func durationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// ParseLevel maps debug|info|warn|error to a slog level (info when unknown).
func ParseLevel(s string) slog.Level {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug
	case "warn", "warning":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

// traceHandler adds trace_id and span_id from the record's context.
type traceHandler struct{ slog.Handler }

func (h *traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h *traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &traceHandler{Handler: h.Handler.WithAttrs(attrs)}
}

func (h *traceHandler) WithGroup(name string) slog.Handler {
	return &traceHandler{Handler: h.Handler.WithGroup(name)}
}

// Discard is a logger that writes nothing (tests, benchmarks).
func Discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
