package consumer

import (
	"cmp"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/contract"
)

// Config configures a Consumer. Zero values take the defaults given. The
// default of a field read from the environment is its variable's envDefault
// in internal/config (taken from there by withDefaults, so it is written
// once); a test checks that the comments below say the same.
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
	// SessionTimeout: how long the coordinator keeps a member that stopped
	// heartbeating before its partitions move (CONSUMER_SESSION_TIMEOUT):
	// the stall after a consumer is SIGKILLed. Default 6s. Members
	// heartbeat every tenth of it, so the survivors hear of the rebalance
	// within a second of the dead member's expiry, not after franz-go's 3s.
	SessionTimeout time.Duration
	// RebalanceTimeout: how long members may take to rejoin a rebalance
	// (CONSUMER_REBALANCE_TIMEOUT); the batch in flight holds it. Default
	// 30s.
	RebalanceTimeout time.Duration
	// InstanceID: static membership (CONSUMER_INSTANCE_ID). Empty: dynamic.
	InstanceID string
	// GroupProtocol: "classic" or "consumer" (KIP-848)
	// (CONSUMER_GROUP_PROTOCOL). Default classic.
	GroupProtocol string
	// PruneInterval: how often old inbox rows are pruned. Default 10m.
	PruneInterval time.Duration
	// PruneBatch: inbox rows deleted per statement while pruning, so one
	// prune never holds a long transaction. Default 5000.
	PruneBatch int
	// ShutdownTimeout: how long Run may take, once its context is cancelled,
	// to finish the batch in flight and commit it. A batch not finished by
	// then is abandoned uncommitted (it is redelivered and deduplicated
	// later). Default 7s: a batch takes milliseconds, so only a batch
	// retried through an outage waits this long, and a process stops within
	// the 10s orchestrators give between SIGTERM and SIGKILL.
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
	// Values turns a schema-governed record value into the JSON payload
	// (SCHEMA_REGISTRY_URL: a *schema.Registry, which reads Avro back to
	// JSON). Nil: the framing is stripped only (JSON Schema subjects).
	Values contract.ValueDecoder
	// TracerProvider starts the "process <topic>" spans. Nil:
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Logger receives the consumer's logs. Nil: discard.
	Logger *slog.Logger

	// groupOpts are added to the group client only (tests: assignment
	// callbacks, which the dead-letter producer must not get).
	groupOpts []kgo.Opt
}

// ConfigFromEnv maps the CONSUMER_* environment (config.Consumer) to a
// Config; the caller sets Logger and TracerProvider.
func ConfigFromEnv(c config.Consumer) Config {
	return Config{
		Group:            c.Group,
		Topics:           c.Topics,
		DedupWindow:      c.DedupWindow,
		MaxPollRecords:   c.MaxPollRecords,
		SessionTimeout:   c.SessionTimeout,
		RebalanceTimeout: c.RebalanceTimeout,
		InstanceID:       c.InstanceID,
		GroupProtocol:    c.GroupProtocol,
	}
}

// envDefaults are the defaults of the environment-backed fields: the
// envDefault tags of config.Consumer.
var envDefaults = ConfigFromEnv(config.Defaults().Consumer)

func (c Config) withDefaults() Config {
	c = config.FillZero(c, envDefaults)
	c.PruneInterval = cmp.Or(c.PruneInterval, 10*time.Minute)
	c.PruneBatch = cmp.Or(c.PruneBatch, 5000)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 7*time.Second)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, 100*time.Millisecond)
	c.RetryBackoffMax = cmp.Or(c.RetryBackoffMax, 5*time.Second)
	c.DeadLetterTimeout = cmp.Or(c.DeadLetterTimeout, 30*time.Second)
	return c
}

// heartbeatInterval is a tenth of the session timeout (at most franz-go's
// 3s default, at least 100ms): a survivor learns that a rebalance began on
// its next heartbeat, so this is added to every failover.
func (c Config) heartbeatInterval() time.Duration {
	return min(max(c.SessionTimeout/10, 100*time.Millisecond), 3*time.Second)
}
