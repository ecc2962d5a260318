package consumer

// The consumer's SQL over its own table, bridge.consumer_inbox. The
// subscriptions it routes by and the deliveries it writes go through the
// delivery store (internal/delivery/store).

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

// deleteTopicInbox removes the inbox rows of one topic (the demo's run topic,
// once the run is over: nothing will redeliver it).
const deleteTopicInbox = `DELETE FROM bridge.consumer_inbox WHERE topic = $1`
