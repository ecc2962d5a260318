// Package demo is `bridge demo`: the whole pipeline in one process, fed by a
// small asset-lifecycle workload and checked by a webhook receiver that
// trusts nothing it is sent.
//
// The demo is a proof as much as a tour. Its receiver (internal/webhooktest,
// the one every test and the compose sample use) verifies every request's
// Standard Webhooks signature with the subscription's secret (the official
// standardwebhooks library, not the bridge's own signing code, so a bug in
// one cannot hide a bug in the other), ignores duplicates by webhook-id (the
// pipeline is at least once into Kafka and a retry may repeat a request), and
// checks that each asset's asset_seq only ever goes up and that no two of an
// asset's requests are in flight at once — the per-(subscription, asset) order
// the bridge promises. The summary counts what it found; the command exits 1 if
// any order violation, overlap or bad signature was seen, or if an enqueued
// event never arrived.
//
// The workload is what an asset service writes: uploads, version publishes,
// "publish the new version and expire the old one" in one transaction (two
// events of one asset that a created_at ordering would shuffle:
// docs/failure-modes.md §9), deletions, a few events of the null-asset stream, and one
// poison event larger than RELAY_MAX_MESSAGE_BYTES that the relay parks as
// FAILED while the rest of its asset's stream moves on.
//
// The demo does not wire the pipeline itself: Env.Pipeline is the same
// relay + consume + deliver that `bridge run` starts (internal/cli), so what
// the demo shows is what runs in production.
package demo
