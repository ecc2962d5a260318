package consumer

import "github.com/twmb/franz-go/pkg/kgo"

// TopicOptions turns CONSUMER_TOPICS into consume options (plain names, or
// "~" regular expressions that never match a dead-letter topic), for every
// group member that reads the event topics: this consumer and the
// deliverer's fast lane.
func TopicOptions(topics []string) ([]kgo.Opt, error) { return topicOptions(topics) }

// IsRecordFault reports whether err, from a transaction writing records'
// deliveries, is the records' own fault (PostgreSQL refused their data, see
// classify): retrying the same records cannot succeed, so the writer
// isolates them and dead-letters the offender instead.
func IsRecordFault(err error) bool { return classify(err) == recordFault }
