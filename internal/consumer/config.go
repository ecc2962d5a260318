package consumer

import (
	"cmp"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/config"
)

// Config configures a Consumer. Zero values take the defaults given.
type Config struct {
	// Group is the Kafka consumer group (CONSUMER_GROUP). Default
	// "outbox-bridge".
	Group string
	// Topics to consume (CONSUMER_TOPICS). An entry starting with "~" is a
	// regular expression; when there is one, every plain entry is matched
	// exactly and topics ending in ".dlq" are never consumed. Required.
	Topics []string
	// DedupWindow: inbox rows older than this are pruned
	// (CONSUMER_DEDUP_WINDOW). A record redelivered after this is treated as
	// new. Default 168h (7 days).
	DedupWindow time.Duration
	// MaxPollRecords: records per poll, and so per transaction
	// (CONSUMER_MAX_POLL_RECORDS). A batch must finish within the group's
	// rebalance timeout. Default 500.
	MaxPollRecords int
	// PruneInterval: how often old inbox rows are pruned. Default 10m.
	PruneInterval time.Duration
	// PruneBatch: inbox rows deleted per statement while pruning, so one
	// prune never holds a long transaction. Default 5000.
	PruneBatch int
	// ShutdownTimeout: how long Run may take, once its context is cancelled,
	// to finish the batch in flight and commit it. A batch not finished by
	// then is abandoned uncommitted (it is redelivered and deduplicated
	// later). Default 30s.
	ShutdownTimeout time.Duration
	// RetryBackoff and RetryBackoffMax: delay before retrying a failed
	// transaction or dead-letter produce, doubling up to the max. Defaults
	// 100ms and 5s.
	RetryBackoff    time.Duration
	RetryBackoffMax time.Duration
	// DeadLetterTimeout bounds one dead-letter produce, so a missing
	// "<topic>.dlq" topic turns into a logged, retried error instead of a
	// silent wait. Default 30s.
	DeadLetterTimeout time.Duration
	// TracerProvider starts the "process <topic>" spans. Nil:
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Logger receives the consumer's logs. Nil: discard.
	Logger *slog.Logger
}

// ConfigFrom maps the CONSUMER_* environment (config.Consumer) to a Config;
// the caller sets Logger and TracerProvider.
func ConfigFrom(c config.Consumer) Config {
	return Config{
		Group:          c.Group,
		Topics:         c.Topics,
		DedupWindow:    c.DedupWindow,
		MaxPollRecords: c.MaxPollRecords,
	}
}

func (c Config) withDefaults() Config {
	c.Group = cmp.Or(c.Group, "outbox-bridge")
	c.DedupWindow = cmp.Or(c.DedupWindow, 7*24*time.Hour)
	c.MaxPollRecords = cmp.Or(c.MaxPollRecords, 500)
	c.PruneInterval = cmp.Or(c.PruneInterval, 10*time.Minute)
	c.PruneBatch = cmp.Or(c.PruneBatch, 5000)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 30*time.Second)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, 100*time.Millisecond)
	c.RetryBackoffMax = cmp.Or(c.RetryBackoffMax, 5*time.Second)
	c.DeadLetterTimeout = cmp.Or(c.DeadLetterTimeout, 30*time.Second)
	return c
}
