// Package relay moves committed outbox rows to Kafka (`bridge relay`).
//
// Each cycle claims NEW rows of the lanes this replica leases, in seq order,
// produces them (key = asset id, Java-compatible murmur2 partitioning,
// idempotent producer, acks=all), waits for every acknowledgement and only
// then marks rows SENT with partition and offset. A crash between produce and
// mark re-sends the row later with the same dedup-id: at least once, never
// lost.
//
// Order. Per asset, enqueue serialises writers (so seq order = commit order);
// an asset hashes onto one of 64 lanes and a lane is leased to one replica
// (so one replica at a time produces an asset's rows); a row waiting for its
// retry holds back the later rows of its own asset and nothing else (the
// claim's per-asset hold).
//
// Failures (docs/failure-modes.md §4). A failed send is classified: retriable errors
// charge the row an attempt and schedule a retry with exponential backoff;
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
