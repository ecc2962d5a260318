// Package opsserver is the operational HTTP server on HTTP_ADDR:
//
//	GET /healthz  200 while the process runs (liveness: restart me if not)
//	GET /readyz   200 when PostgreSQL answers, its schema is the one this
//	              binary needs and a Kafka broker answers; 503 with the failing
//	              check otherwise (readiness: send me no traffic, page nobody)
//	GET /metrics  Prometheus exposition (internal/metrics)
//
// Other handlers (the admin API, the console under /ui/) mount on the same
// mux with Handle, so one port serves everything an operator or an
// orchestrator asks of a replica.
package opsserver
