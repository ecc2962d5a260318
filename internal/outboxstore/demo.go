package outboxstore

import (
	"context"
	"fmt"
)

// Statements for `bridge demo`, whose runs each have a topic of their own
// (so the topic filter is the run filter).

// topicCountsSQL: a topic's rows the relay has sent and parked.
const topicCountsSQL = `
SELECT count(*) FILTER (WHERE status = 'SENT'),
       count(*) FILTER (WHERE status = 'FAILED')
  FROM bridge.outbox
 WHERE topic = $1`

// TopicCounts returns how many rows of topic are SENT and FAILED.
func TopicCounts(ctx context.Context, db DB, topic string) (sent, failed int64, err error) {
	if err := db.QueryRow(ctx, topicCountsSQL, topic).Scan(&sent, &failed); err != nil {
		return 0, 0, fmt.Errorf("count outbox rows of %s: %w", topic, err)
	}
	return sent, failed, nil
}

// foreignNewRowsSQL counts rows waiting to be relayed whose topic does not
// start with prefix. The demo's relay claims every NEW row of the database,
// whatever its topic, and would send them to the demo's broker.
const foreignNewRowsSQL = `
SELECT count(*), coalesce(min(topic), '')
  FROM bridge.outbox
 WHERE status = 'NEW' AND NOT starts_with(topic, $1)`

// ForeignNewRows returns how many NEW rows have a topic outside prefix, and
// the first such topic.
func ForeignNewRows(ctx context.Context, db DB, prefix string) (n int64, topic string, err error) {
	if err := db.QueryRow(ctx, foreignNewRowsSQL, prefix).Scan(&n, &topic); err != nil {
		return 0, "", fmt.Errorf("count waiting outbox rows: %w", err)
	}
	return n, topic, nil
}

// deleteTopicSQL removes every row of a topic: a finished demo run's or
// benchmark's (its topic is its own). A demo's parked poison row would
// otherwise stay FAILED forever and page whoever alerts on parked rows.
// deleteTopicSQL removes a scratch topic's events from the log and the held
// rows (the demo's and the benchmark's own topics only).
const deleteTopicSQL = `
WITH h AS (DELETE FROM bridge.outbox_held WHERE topic = $1)
DELETE FROM bridge.outbox_log WHERE topic = $1`

// DeleteTopic deletes every row of topic.
func DeleteTopic(ctx context.Context, db DB, topic string) error {
	if _, err := db.Exec(ctx, deleteTopicSQL, topic); err != nil {
		return fmt.Errorf("delete outbox rows of %s: %w", topic, err)
	}
	return nil
}
