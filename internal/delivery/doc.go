// Package delivery is the delivery engine: the Deliverer (claim loop, worker
// pool, outcome recording, reclaim, release on shutdown, retention), the
// SSRF-safe HTTP client, Standard Webhooks signing and the retry schedule.
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
