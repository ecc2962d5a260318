// Package metrics exports the bridge's OpenTelemetry metrics for Prometheus
// (GET /metrics on HTTP_ADDR) and implements the hook interfaces the relay,
// the consumer and the delivery engine report through. docs/observability.md
// lists every series with its meaning.
//
// Two kinds of series:
//
//   - Counters and histograms recorded as work happens (rows produced,
//     attempts charged, webhook attempts and their duration).
//   - Gauges of state that lives in PostgreSQL or Kafka (outbox rows by
//     status, the oldest NEW row's age, deliveries by status, consumer lag).
//     They are read by a query, and a query per scrape is a query storm
//     waiting to happen: several Prometheus servers, a dashboard refreshing
//     every second, every replica answering. So each source is read at most
//     once per refresh interval (default 10s), on demand, by one goroutine
//     while concurrent scrapes wait for its result; between reads the cached
//     snapshot is served, and when a read fails the last good snapshot stays
//     (bridge_metrics_refresh_errors_total counts the failures).
//
// The package holds no global state: each Metrics has its own MeterProvider
// and its own prometheus.Registry.
package metrics
