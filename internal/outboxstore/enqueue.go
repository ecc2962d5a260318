package outboxstore

// LockCountersSQL locks every asset counter of an outbox.EnqueueBatch in
// sorted key order, creating missing ones at 0, in one statement:
// INSERT … SELECT … ORDER BY processes rows in that order, and ON CONFLICT DO
// UPDATE locks an existing row just as the insert locks a new one — WHERE
// false locks it without writing a new version of it (a version per asset
// per batch that nothing can prune while another session holds a
// transaction open; see migration 00130).
// bridge.enqueue then finds the counters already locked by this transaction.
// (Inserting the missing rows and locking the existing ones in two steps would
// lock out of order and deadlock against a batch doing the same in reverse.)
// It is exported for the outbox package, which queues it on the caller's
// batch ahead of the events.
const LockCountersSQL = `
INSERT INTO bridge.asset_counters AS c (asset_key, last_asset_seq)
SELECT k, 0 FROM unnest($1::text[]) AS k ORDER BY k
ON CONFLICT (asset_key) DO UPDATE SET last_asset_seq = c.last_asset_seq WHERE false`
