// Package store owns the delivery tables: bridge.subscriptions,
// bridge.subscription_secrets, bridge.deliveries, bridge.delivery_streams and
// bridge.delivery_attempts. Every statement over them lives here, one named
// constant each, beside the comment that says why it is written the way it
// is; nothing else in the repository writes to these tables.
//
//   - subscriptions.go: endpoints (create, update, enable/disable, delete) and
//     the consumer's routing read.
//   - secrets.go: signing secrets (the only place a secret is written or read).
//   - enqueue.go: the consumer's insert into the delivery queue (fan-out).
//   - claim.go: the delivery claim — at most one in flight per (subscription,
//     asset), at most the per-subscription cap per subscription.
//   - outcomes.go: what an attempt produced (delivered, retry, dead), reclaim of
//     expired leases and release of claims on shutdown.
//   - revive.go: dead → pending with attempts reset.
//   - log.go: the delivery log (never the payload) and its attempts.
//   - retention.go: deletion of delivered rows past retention and of idle
//     streams.
//   - stats.go: the counts metrics and the demo read.
//   - inspect.go: the console's views (health, one stream, a test event).
//
// Queries are static strings; optional filters are `($n IS NULL OR column =
// $n)`, so none is assembled at run time.
package store
