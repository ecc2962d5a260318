// Package delivery is the delivery engine (the slow lane when the fast lane
// is on): the Deliverer, the SSRF-safe HTTP client, Standard Webhooks
// signing and the retry schedule.
//
// The Deliverer's background work is one Service per job under one
// supervisor (Supervise), each with its own config struct and defaults:
//
//   - the delivery pipeline (pipeline.go): claim loops (claim.go), workers
//     (send.go) and outcome recorders (record.go), sharing one budget of
//     claim slots and bytes and one ordered shutdown;
//   - Notifier (notify.go): LISTEN bridge_deliveries, waking the claim loops;
//   - Reclaimer (reclaim.go): stalled claims back to pending, attempt kept;
//   - Retention (retention.go): delivered rows and idle streams past
//     WEBHOOK_RETENTION, in batches;
//   - HistoryCopier (history.go): the history of subscriptions created with
//     --since.
//
// Run releases the claims still held once every service has returned.
// Its tables — subscriptions, secrets, deliveries, delivery streams and the
// attempt log — are owned by the store subpackage (internal/delivery/store),
// where every statement over them lives.
//
// Every rule here is a named failure mode (docs/failure-modes.md §6, §7 and §12–§14):
//
//   - One delivery in flight per (subscription, asset): an
//     asset.version_created delivered after asset.expired republishes an asset
//     whose rights were withdrawn. The claim's sibling check and the claim are
//     one statement with FOR UPDATE SKIP LOCKED.
//   - A stalled claim (killed worker) would halt its stream forever:
//     ReclaimStalled returns it after WEBHOOK_LEASE and keeps the attempt, since
//     the request may have arrived.
//   - A rolling restart must not look like a failing endpoint: Release gives
//     claims back without charging the attempt.
//   - Only deaths move a subscription's consecutive_failures, so one payload
//     an endpoint chokes on cannot disable a healthy endpoint; any success
//     resets it.
//   - Revive resets attempts: the operator has just fixed the endpoint.
//   - The log never reads the payload column: it is the largest column, on the
//     most-run query, and the cheapest way to read a tenant's history.
//
// The statements behind these rules are in internal/delivery/store:
// claim.go, outcomes.go, revive.go, log.go.
package delivery
