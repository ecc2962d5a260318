package demo

// Every statement the demo runs itself (the pipeline's own live in its
// packages). They are read-only: the demo writes only through outbox.Enqueue
// and the subscription store, and reads its deliveries through the delivery
// store.

// outboxCountsSQL: this run's rows the relay has sent and parked. A run has
// a topic of its own, so the topic filter is the run filter.
const outboxCountsSQL = `
SELECT count(*) FILTER (WHERE status = 'SENT'),
       count(*) FILTER (WHERE status = 'FAILED')
  FROM bridge.outbox
 WHERE topic = $1`

// foreignNewRowsSQL counts rows waiting to be relayed that do not belong to a
// demo. The demo's relay claims every NEW row of the database, whatever its
// topic, and would send them to the demo's broker.
const foreignNewRowsSQL = `
SELECT count(*), coalesce(min(topic), '')
  FROM bridge.outbox
 WHERE status = 'NEW' AND topic NOT LIKE 'demo.assets.%'`

// liveRelaysSQL lists relay replicas whose membership has not expired.
const liveRelaysSQL = `
SELECT member_id, hostname, ceil(extract(epoch FROM expires_at - now()))::int
  FROM bridge.relay_members
 WHERE expires_at > now()
 ORDER BY member_id`

// databaseExistsSQL: does the scratch database exist yet?
const databaseExistsSQL = `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`

// deleteRunOutboxSQL and deleteRunInboxSQL remove a finished run's rows (its
// topic is its own): the parked poison row would otherwise stay FAILED
// forever and page whoever alerts on parked rows.
const deleteRunOutboxSQL = `DELETE FROM bridge.outbox WHERE topic = $1`

const deleteRunInboxSQL = `DELETE FROM bridge.consumer_inbox WHERE topic = $1`
