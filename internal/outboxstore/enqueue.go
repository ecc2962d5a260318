package outboxstore

// LockCountersSQL locks every asset counter of a batch in
// sorted key order, creating missing ones at 0, in one statement:
// INSERT … SELECT … ORDER BY processes rows in that order, and ON CONFLICT DO
// UPDATE locks an existing row just as the insert locks a new one — WHERE
// false locks it without writing a new version of it (a version per asset
// per batch that nothing can prune while another session holds a
// transaction open; see migration 00130).
// bridge.enqueue then finds the counters already locked by this transaction.
// (bridge.enqueue_batch, which outbox.EnqueueBatch calls, takes the same
// locks in the same order itself, migration 00151.)
// (Inserting the missing rows and locking the existing ones in two steps would
// lock out of order and deadlock against a batch doing the same in reverse.)
// It is exported for callers that pre-lock a batch of bridge.enqueue calls.
const LockCountersSQL = `
INSERT INTO bridge.asset_counters AS c (asset_key, last_asset_seq)
SELECT k, 0 FROM unnest($1::text[]) AS k ORDER BY k
ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = c.last_asset_seq WHERE false`
