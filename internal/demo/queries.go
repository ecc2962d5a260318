package demo

// Every statement the demo runs itself (the pipeline's own live in its
// packages; those over bridge.outbox in internal/outboxstore). They are
// read-only: the demo writes only through outbox.Enqueue, the subscription
// store and each table owner's cleanup, and reads its deliveries through the
// delivery store.

// liveRelaysSQL lists relay replicas whose membership has not expired.
const liveRelaysSQL = `
SELECT member_id, hostname, ceil(extract(epoch FROM expires_at - now()))::int
  FROM bridge.relay_members
 WHERE expires_at > now()
 ORDER BY member_id`

// databaseExistsSQL: does the scratch database exist yet?
const databaseExistsSQL = `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`
