// Package service is the small kit every long-running stage (relay,
// consumer, deliverer) builds its background loops from, so each rule is
// written once:
//
//   - Listen: PostgreSQL LISTEN on a dedicated connection, reconnecting with
//     capped backoff, turning notifications into wake-ups on a channel.
//   - Every: a ticker loop on ctx.Done() with a timeout on each run; a run
//     cut off by shutdown (context.Canceled) is never logged as a failure.
//   - PruneInBatches: delete in bounded batches until a batch comes back
//     short, so retention never holds one long transaction.
//   - Backoff: capped exponential delay with jitter.
//   - Retry: call a function until it succeeds, ctx ends or a deadline passes,
//     logging each class of failure once per interval (waiting for
//     PostgreSQL or Kafka at start instead of exiting).
//   - ReplicaID: the id a replica writes into lease and claim columns.
//
// Each is a plain function or value, not a framework: a stage calls them from
// its own Run, and its shutdown stays its own (River's startstop and dskit's
// services are the models; this is the part of them the bridge needs).
package service
