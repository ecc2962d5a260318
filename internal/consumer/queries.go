package consumer

// The consumer's SQL, one place each.

// selectSubscriptions reads every subscription's routing rule. It runs inside
// the batch's transaction, so one batch is routed against one consistent set;
// Filter.Matches decides (disabled ones included), so the rule lives in Go in
// one place. The table holds one row per endpoint, not per event: small.
const selectSubscriptions = `
SELECT id, enabled, event_types, coalesce(topic, '')
FROM bridge.subscriptions`

// insertInbox records each new record's dedup id; RETURNING lists the ones
// that were not there yet. A conflict means an earlier transaction (this
// consumer before a crash, another member before a rebalance, or the relay's
// duplicate produce) already made the record's deliveries, so it gets none
// now.
//
// Rows go in dedup-id order. Two transactions inserting overlapping sets (the
// old and the new owner of a partition when a member was kicked out of the
// group mid-batch) then take the unique-index locks in the same order: the
// second waits for the first and sees the conflict, instead of each holding a
// row the other needs (a deadlock that would abort one of them).
const insertInbox = `
INSERT INTO bridge.consumer_inbox (dedup_id, topic, kafka_partition, kafka_offset)
SELECT r.dedup_id, r.topic, r.kafka_partition, r.kafka_offset
FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[])
  AS r(dedup_id, topic, kafka_partition, kafka_offset)
ORDER BY r.dedup_id
ON CONFLICT (dedup_id) DO NOTHING
RETURNING dedup_id`

// insertDeliveries writes one delivery per (event, subscription) pair in one
// statement: $1..$9 are the events (each payload sent once), $10/$11 the
// pairs as (event index, subscription id), in record order. ORDER BY m.ord
// makes the seq default (nextval, evaluated above the sort) follow that
// order, so a (subscription, asset) stream's seq is Kafka's partition order.
// ON CONFLICT covers a record seen again after its inbox row was pruned while
// its deliveries still exist.
const insertDeliveries = `
WITH ev AS (
  SELECT *
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[],
              $6::text[], $7::timestamptz[], $8::text[], $9::text[])
    WITH ORDINALITY AS e(event_id, event_type, topic, asset_id, asset_seq,
                         payload, event_created_at, traceparent, tracestate, idx)
), m AS (
  SELECT * FROM unnest($10::bigint[], $11::uuid[]) WITH ORDINALITY AS m(idx, subscription_id, ord)
)
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq,
                               payload, event_created_at, traceparent, tracestate)
SELECT m.subscription_id, ev.event_id, ev.event_type, ev.topic, ev.asset_id, ev.asset_seq,
       ev.payload::jsonb, ev.event_created_at, ev.traceparent, ev.tracestate
FROM m JOIN ev ON ev.idx = m.idx
ORDER BY m.ord
ON CONFLICT (subscription_id, event_id) DO NOTHING`

// pruneInbox deletes up to $2 inbox rows received more than $1 seconds ago
// (by the database's clock, the one that wrote received_at). SKIP LOCKED
// lets several replicas prune at once without waiting on (or deadlocking
// with) each other; a bounded batch keeps each statement short.
const pruneInbox = `
WITH old AS (
  SELECT dedup_id FROM bridge.consumer_inbox
  WHERE received_at < now() - make_interval(secs => $1::float8)
  ORDER BY received_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)
DELETE FROM bridge.consumer_inbox i USING old WHERE i.dedup_id = old.dedup_id`
