package relay

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/service"
)

// ValueMaker maps a row's (topic, payload) to its record value. A
// *schema.Registry is one.
type ValueMaker interface {
	Value(ctx context.Context, topic string, payload []byte) ([]byte, error)
}

// Config configures a Relay. Zero values take the defaults given. A field
// read from the environment names its variable; its default is that
// variable's envDefault in internal/config, taken from there by WithDefaults
// (written once; a test checks the comments below repeat it correctly).
type Config struct {
	// MaxAttempts is the number of failed sends charged to a row before it is
	// parked as FAILED (RELAY_MAX_ATTEMPTS). Default 10.
	MaxAttempts int
	// BackoffBase is the delay before the second attempt; it doubles with
	// each attempt up to BackoffMax (RELAY_BACKOFF_BASE). Default 7s (10
	// attempts span ~1 hour).
	BackoffBase time.Duration
	// BackoffMax caps one backoff delay (RELAY_BACKOFF_MAX). Default 30m.
	BackoffMax time.Duration
	// BatchSize is the number of rows claimed and produced per cycle
	// (RELAY_BATCH_SIZE). Default 1000.
	BatchSize int
	// BatchBytes bounds the payload bytes claimed per cycle, so the relay's
	// memory is bounded by bytes and not by BatchSize times the largest
	// payload (a batch always holds at least one row) (RELAY_BATCH_BYTES).
	// Default 16777216 (16 MiB).
	BatchBytes int
	// PollInterval is the fallback poll when no NOTIFY arrives
	// (RELAY_POLL_INTERVAL). Default 1s.
	PollInterval time.Duration
	// LeaseTimeout is the lane lease; a dead replica's lanes move after at
	// most this (RELAY_LEASE_TIMEOUT). Default 15s.
	LeaseTimeout time.Duration
	// ProduceTimeout bounds one produce attempt (franz-go would otherwise
	// retry a retriable error forever and the row would never be counted)
	// (RELAY_PRODUCE_TIMEOUT). Default 30s.
	ProduceTimeout time.Duration
	// Retention: how long sent events stay readable at least (RELAY_RETENTION; see Rotation).
	// Default 24h.
	Retention time.Duration
	// MaxMessageBytes: a payload larger than this is parked without sending
	// (RELAY_MAX_MESSAGE_BYTES). Default 1000000.
	MaxMessageBytes int
	// OperationsTopic: a row parked as FAILED is announced there
	// (bridge.outbox.failed) in the parking transaction
	// (BRIDGE_OPERATIONS_TOPIC). "": not announced.
	OperationsTopic string
	// CloudEventsSource, when not empty, adds the CloudEvents binary-mode
	// headers to every record with it as ce_source (RELAY_CLOUDEVENTS=binary
	// and RELAY_CLOUDEVENTS_SOURCE). Default: none (off).
	CloudEventsSource string
	// Values, when set, makes each record's value from its row's topic and
	// payload: for a schema-governed topic (outbox/schema) the payload
	// validated and framed with the Confluent wire format. An error wrapping
	// schema.ErrViolation parks the row at its first try (poison); any other
	// error is charged as a failed send. nil: the value is the payload
	// (SCHEMA_REGISTRY_URL unset).
	Values ValueMaker
	// MemberID identifies this replica in bridge.relay_lanes. Default: a new
	// random id per Relay (a restarted process never inherits a zombie's
	// leases).
	MemberID string
	// TracerProvider for the PRODUCER spans. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Metrics receives counters; nil records nothing.
	Metrics Metrics
	// Logger; default discards.
	Logger *slog.Logger
	// ClaimObserver, when set, is told how long each claim statement took
	// and how many rows it returned (benchmarks track the claim's cost over
	// a run with it). Default: none.
	ClaimObserver func(took time.Duration, rows int)
	// CycleObserver, when set, is told when each cycle (claim, produce, wait
	// for the previous marks) went through its steps: benchmarks split
	// commit→ack with it (an event that waited for the relay waited for one
	// of these, or for the NOTIFY while the relay was idle). Default: none.
	CycleObserver func(CycleTimes)
}

// CycleTimes is when one relay cycle went through its steps. The loop was
// idle (waiting for a NOTIFY, the poll or a change of lanes) from IdleFrom
// to ClaimStart; IdleFrom is zero when the cycle followed the previous one
// at once (a backlog). Produced is when every record was handed to the
// Kafka client (zero: nothing produced), Acked when the last ack arrived,
// Settled when the wait for the previous batch's marks ended (the next
// claim starts after it).
type CycleTimes struct {
	IdleFrom, ClaimStart, ClaimEnd, Produced, Acked, Settled time.Time
	Rows                                                     int
}

// envDefaults are the RELAY_* envDefault tags as a Config.
var envDefaults = ConfigFromEnv(config.Defaults().Relay)

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c = config.FillZero(c, envDefaults)
	if c.MemberID == "" {
		c.MemberID = service.ReplicaID()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Metrics == nil {
		c.Metrics = noMetrics{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Metrics is what the relay reports as it works (implemented by the
// observability package; see docs/observability.md).
type Metrics interface {
	// Produced counts rows acknowledged by the broker, with the
	// commit→ack latency of each.
	Produced(topic string, latency time.Duration)
	// AttemptCharged counts a failed send charged to a row.
	AttemptCharged(topic string)
	// Parked counts rows parked as FAILED, by reason (poison, exhausted).
	Parked(topic, reason string)
	// Outage reports whether the relay currently sees no reachable broker.
	Outage(active bool)
}

type noMetrics struct{}

func (noMetrics) Produced(string, time.Duration) {}
func (noMetrics) AttemptCharged(string)          {}
func (noMetrics) Parked(string, string)          {}
func (noMetrics) Outage(bool)                    {}
