// Package relay moves committed outbox events to Kafka (`bridge relay`).
//
// The outbox is a log (migration 00230, docs/architecture.md "The outbox as
// a log"). Each cycle reads a page of its lane groups' batches — the events
// visible in a newer snapshot and not in the lanes' position — and the held
// rows that are due, produces them (key = asset id, Java-compatible murmur2
// partitioning, idempotent producer, acks=all), waits for every
// acknowledgement, holds what did not go out, and moves the lanes' position
// past the batch (saved about once a second). A crash before the position is
// saved re-sends the last events with the same dedup-id: at least once,
// never lost.
//
// Order. Per asset, enqueue serialises writers (so commit order is the order
// a snapshot sees them in); an asset hashes onto one of 64 lanes and a lane is
// leased to one replica (so one replica at a time produces an asset's
// events); a row waiting for its retry holds back the later rows of its own
// asset, which are held behind it, and nothing else.
//
// Failures (docs/failure-modes.md §4). A failed send is classified: retriable errors
// charge the row an attempt (in bridge.outbox_held) and schedule a retry with exponential backoff;
// after MaxAttempts the row is parked as FAILED and the relay continues past
// it (a loop that stopped at it would pile up everything behind it). Errors retrying cannot fix park at
// once — after re-sending the row alone when the broker rejects whole batches
// (MESSAGE_TOO_LARGE), because its innocent neighbours see the same error. A
// broker-wide outage charges nothing: when no record of a batch got through
// and no broker answers a ping, the relay backs off and probes until one
// does.
//
// Tracing. Each row gets a PRODUCER span "publish <topic>" parented on the
// trace context stored with the row; its context travels in the record's
// traceparent header. The span is started here rather than through
// plugin/kotel because kotel names the span "<topic> publish", cannot set the
// dedup id as messaging.message.id, and injects through the global
// propagator, which is a no-op when no SDK is configured — the stored
// traceparent must travel even then.
package relay
