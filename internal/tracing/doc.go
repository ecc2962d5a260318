// Package tracing carries W3C trace context across the bridge's hops (outbox
// row → Kafka record → delivery row → webhook request) and sets up the
// OpenTelemetry SDK from the standard OTEL_* variables.
//
// A polled outbox row has lost its request: the request that wrote it is long
// finished when the relay reads it. Unless the context is stored with the row
// and restored at every hop, each consumed event starts its own trace and shows
// up in Jaeger as an orphan (docs/failure-modes.md §11).
package tracing
