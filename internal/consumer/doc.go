// Package consumer is `bridge consume`: a Kafka consumer group that turns each
// record into one bridge.deliveries row per matching subscription, exactly
// once, keeping Kafka's partition order (and so each asset's order) in the
// deliveries' seq.
//
// # Exactly once into PostgreSQL
//
// Kafka gives the consumer at-least-once: a record comes again after a crash
// before the offset commit, after a rebalance, and whenever the relay produced
// it twice (same dedup-id). For each polled batch the consumer runs ONE
// transaction that
//
//  1. inserts every record's dedup id into bridge.consumer_inbox with
//     ON CONFLICT DO NOTHING — a conflict means an earlier transaction already
//     turned that record into deliveries, so it gets none now;
//  2. for the records that were new, inserts one delivery per matching enabled
//     subscription, in record order, so the bigserial seq follows partition
//     order;
//
// and commits the Kafka offsets of the batch only after that transaction has
// committed (and after any dead-lettered record of the batch was acknowledged
// by the broker). A crash anywhere before the offset commit only causes a
// redelivery, which the inbox turns into a no-op; a crash after it loses
// nothing, because the deliveries were already committed. Offsets never run
// ahead of the database. Records that carry no dedup-id (foreign producers)
// are identified by "topic/partition/offset", which is stable across
// redeliveries of the same record.
//
// # Why manual commits with BlockRebalanceOnPoll
//
// The client runs with kgo.DisableAutoCommit and kgo.BlockRebalanceOnPoll
// (franz-go examples/group_committing). Without the block, this sequence is
// possible:
//
//  1. member A polls offsets 100..199 of partition 3 and starts its
//     transaction;
//  2. member B joins; the group rebalances while A is still working, and
//     partition 3 moves to B with the committed offset still at 100;
//  3. B polls 100..199 again; its inbox inserts wait for A's open transaction
//     and then conflict, so B adds no deliveries — but it has processed (and
//     fetched, traced, counted) the whole batch a second time;
//  4. A commits its transaction, then commits offset 200 for a partition it no
//     longer owns; if that commit lands after B has already committed 260, it
//     rewinds B, and the next rebalance replays 200..259 once more.
//
// The inbox keeps every one of these replays from creating a delivery, but the
// replays are real work, and they grow with batch size and rebalance
// frequency (a rolling deploy rebalances once per replica). With
// BlockRebalanceOnPoll the rebalance of step 2 cannot start while A holds
// polled records: A finishes its transaction, commits the offsets of the
// partitions it still owns (CommitRecords, exactly the records it processed),
// and only then calls AllowRebalance, after which the partition moves with its
// commit at 200. B starts exactly where A stopped: nothing is lost and nothing
// is processed twice (TestRebalanceWhenSecondMemberJoinsLosesAndDuplicatesNothing
// lands the rebalance in that window and asserts zero duplicates).
//
// The price is that a batch must finish within the group's rebalance timeout
// (CONSUMER_REBALANCE_TIMEOUT, default 30s); CONSUMER_MAX_POLL_RECORDS bounds
// a batch. If PostgreSQL is
// down longer than that, the member is removed from the group while it
// retries; its late offset commit then fails, is logged and counted, and the
// records' new owner finds them in the inbox — still exactly once.
//
// The alternative, storing offsets in PostgreSQL in the same transaction and
// seeking to them on assignment, would also work but makes the offsets
// invisible to Kafka tooling (lag, kafka-consumer-groups); keeping them in
// Kafka keeps the standard lag metrics meaningful.
//
// # A member that dies
//
// A SIGKILLed member (or one cut off the network) sends no LeaveGroup; the
// coordinator keeps it, and its partitions idle, until its session times
// out. franz-go's default is 45s, and when the dead member was the group's
// leader the survivors then waited in SyncGroup for a second timeout: 68–109s
// without webhooks after a routine node failure. CONSUMER_SESSION_TIMEOUT
// bounds it, and members heartbeat every tenth of it, so a survivor learns
// of the rebalance within a heartbeat of the expiry: the stall is the
// session timeout plus up to a heartbeat plus the rejoin, which grows with
// the machine's load. The default is 6s, the broker's default
// group.min.session.timeout.ms, so that it stays under 10s on a loaded
// machine. Measured from outside (the group's committed offsets,
// internal/chaos TestConsumerStallAfterSIGKILL, 10 kills each, load 10–20 on
// 2 cores): 6s gives 6.0–6.8s (median 6.3s); 7s 7.1–8.4s (and 9.1s at load
// 40); 8s 8.1–9.0s; 10s 10.4–11.6s.
// A shorter timeout evicts a live member whose heartbeats are held up that
// long (CPU starvation, a paused VM, a network blip): its group rebalances
// and its uncommitted batch is read again by the new owner, which the inbox
// drops — a pause, never a loss or a duplicate.
//
// CONSUMER_INSTANCE_ID (static membership) makes a restart cost no
// rebalance: the member rejoins under its old identity and gets its own
// partitions back (TestStaticMemberRestartKeepsItsPartitionsWithoutARebalance).
// It does not shorten a crash's stall: a static member is only replaced when
// its session expires.
//
// CONSUMER_GROUP_PROTOCOL=consumer selects KIP-848 (franz-go's
// ServerSideBalancer opt-in): the broker assigns partitions and moves them
// member by member. Against Kafka 4.1.1 the group really runs as a
// "consumer"-type group, but its session timeout is the broker's
// group.consumer.session.timeout.ms, 45s by default and never below
// group.consumer.min.session.timeout.ms (also 45s; a per-group
// consumer.session.timeout.ms of 10s is refused with INVALID_CONFIG): a
// SIGKILLed member's partitions stalled 45s. franz-go also recommends it
// only from Kafka 4.3 (a STALE_MEMBER_EPOCH on an offset commit before that
// is not handled for the caller). So classic stays the default; choose
// consumer where the brokers' group.consumer.* settings are lowered.
//
// # Records that cannot be processed
//
// A record whose value is not JSON (or not UTF-8), whose headers cannot be read
// (a non-numeric asset-seq, a header or key that is not UTF-8 text, no
// event-type), whose key, dedup-id or event-type is past its bound
// (internal/eventbounds), or whose data PostgreSQL refuses (classify: a
// \u0000 escape in jsonb, an index entry too large, …; the batch is split
// in halves under savepoints until such records are alone, and the rest
// commits) is produced to "<topic>.dlq" with its original key, value, headers and
// timestamp plus a dlq-reason header (and dlq-topic, dlq-partition,
// dlq-offset), and counted in Stats.DeadLettered. It never enters the inbox.
// The dead-letter produce is acknowledged before the batch's offsets are
// committed, so a crash in between produces the dead letter again on
// redelivery instead of losing it; the partition never stalls on one record.
//
// # Tracing
//
// Each record gets a CONSUMER span "process <topic>" whose parent is the
// record's traceparent header; the span's context is stored on the record's
// deliveries, so the webhook request continues the trace. When the span is not
// recording (no SDK, or not sampled), the header's own traceparent is stored
// instead, so the trace continues even without an exporter.
package consumer
