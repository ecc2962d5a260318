// Package contract is what crosses a stage boundary, written down once:
//
//   - the Kafka record the relay produces and the consumer reads (header
//     names, [Encode], [Decode]);
//   - the webhook request the deliverer sends and every receiver parses
//     (header names, [Envelope]);
//   - the event-type [Filter] that routes a record to a subscription
//     (validation and matching).
//
// The stages meet only through PostgreSQL tables and these formats, so a
// rule written twice here would drift: a consumer reading "the" dedup-id
// must read the header the relay wrote, a receiver must parse the body the
// deliverer built. The golden files in testdata pin the bytes on the wire;
// docs/contract.md describes them for people.
package contract
