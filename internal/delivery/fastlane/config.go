package fastlane

import (
	"cmp"
	"log/slog"
	"net/netip"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/keyring"
	"github.com/outboxbridge/bridge/internal/logging"
	"github.com/outboxbridge/bridge/internal/service"
)

// Config configures a Lane. Zero fields take the defaults named.
type Config struct {
	// Group is the Kafka consumer group of the delivering members. Default
	// "outbox-bridge-deliver".
	Group string
	// Topics are the event topics (CONSUMER_TOPICS' syntax). Required.
	Topics []string
	// Workers: HTTP requests in flight at most. Default 128.
	Workers int
	// InFlightLimit: LimitAdaptive (the default) sends at most a live
	// limit of requests at once, at most Workers, lowered while requests
	// take longer than unloaded and raised while they do not (limiter.go);
	// LimitFixed sends up to Workers at once
	// (WEBHOOK_FAST_LANE_IN_FLIGHT_LIMIT).
	InFlightLimit string
	// MaxInFlightPerSubscription: one subscription's requests in flight at
	// most, both lanes together: each member's fast lane takes the share of
	// it that its share of the partitions is, less one slot per parked
	// stream of the subscription (the slow lane's, see Lane.capOf). Default
	// 64.
	MaxInFlightPerSubscription int
	// Timeout of one HTTP attempt. Default 15s.
	Timeout time.Duration
	// RetrySchedule is the slow lane's: a parked head's next attempt waits
	// its first entry. nil: delivery.DefaultRetrySchedule.
	RetrySchedule []time.Duration
	// MaxBufferedBytes bounds the record bytes held in memory (polled and
	// not yet settled and committed); polling waits above it. Default 64 MiB.
	MaxBufferedBytes int64
	// IsolateAfter: a subscription whose request for one of a partition's
	// oldest records has been in flight this long (a slow endpoint) is
	// handed to the slow lane as a whole on that partition (isolation: the
	// others' offset and memory do not wait for it). Default 2s.
	IsolateAfter time.Duration
	// HoldLimit: a subscription at its in-flight cap with streams waiting
	// for a slot (slower than the others, or left no slot by its parked
	// streams), whose delivery of a partition's oldest unsettled record
	// has waited this long in the fast lane while another subscription has
	// settled that record, is isolated the same way (its backlog holds the
	// partition's offset and memory for the others). Default 10s.
	HoldLimit time.Duration
	// MaxWaiting, MaxWaitingBytes, MaxWaitingAge bound one subscription's
	// backlog in memory on one partition: its deliveries taken from the
	// partition and not yet settled, their record bytes, and how long the
	// oldest of them has waited. A subscription past any of them is isolated
	// on that partition (see Lane.overBounds) when its backlog is its own —
	// none of its streams waits for one of this member's workers — and
	// another subscription on the partition keeps up (within half of every
	// bound): its backlog would otherwise hold the partition's offset, and
	// the member's memory, for the others. Defaults 10,000, 16 MiB and 30s
	// (WEBHOOK_FAST_LANE_MAX_WAITING, _MAX_WAITING_BYTES, _MAX_WAITING_AGE).
	MaxWaiting      int
	MaxWaitingBytes int64
	MaxWaitingAge   time.Duration
	// IsolationPeriod: how long an isolated subscription's new streams on
	// the partition start in the slow lane. Default 30s.
	IsolationPeriod time.Duration
	// HandOverInterval: hand-overs to the slow lane start at most this
	// often, each writing every stream queued meanwhile in one
	// transaction. A parked subscription's live deliveries, handed over as
	// they arrive, made a transaction (and a claim woken by its NOTIFY) per
	// poll, whose CPU the healthy subscriptions' requests waited for.
	// Default 100ms.
	HandOverInterval time.Duration
	// FetchMaxWait: how long the broker may hold a fetch with no record to
	// return (kgo.FetchMaxWait). With the client's 5s, members sat out
	// whole waits in the middle of a drain while committed records were
	// there to read: a 100,000-delivery drain took 6.3–7.1 s against
	// 5.6–5.7 s at the same CPU. An idle member asks again ten times a
	// second per broker. Default 100ms.
	FetchMaxWait time.Duration
	// CommitInterval: how often settled offsets are committed. Default 200ms.
	CommitInterval time.Duration
	// RefreshInterval: how often subscriptions and park markers are read
	// again. Default 1s.
	RefreshInterval time.Duration
	// LogInterval: the attempt log is appended at most this often, one
	// statement per flush. Default 50ms.
	LogInterval time.Duration
	// AttemptRetention: day partitions of the attempt log older than this
	// are dropped (WEBHOOK_RETENTION). Default 168h.
	AttemptRetention time.Duration
	// ShutdownGrace: how long requests in flight may finish at shutdown or
	// on a revoke. Default 5s.
	ShutdownGrace time.Duration
	// SessionTimeout, RebalanceTimeout: the group's (CONSUMER_SESSION_TIMEOUT,
	// CONSUMER_REBALANCE_TIMEOUT). Defaults 6s and 30s.
	SessionTimeout   time.Duration
	RebalanceTimeout time.Duration
	// Keys opens sealed signing secrets. AllowedCIDRs are exempt from the
	// SSRF block list.
	Keys         *keyring.Ring
	AllowedCIDRs []netip.Prefix
	// Values turns a schema-governed record value into the JSON payload
	// (see consumer.Config.Values). Nil: the framing is stripped only.
	Values contract.ValueDecoder
	// TracerProvider records the webhook requests' client spans.
	TracerProvider trace.TracerProvider
	Logger         *slog.Logger
	Metrics        delivery.Metrics
	// ID names this member in a claim it hands over. Default
	// service.ReplicaID().
	ID string

	// groupOpts are added to the group client (tests).
	groupOpts []kgo.Opt
}

func (c Config) withDefaults() Config {
	c.Group = cmp.Or(c.Group, "outbox-bridge-deliver")
	c.Workers = cmp.Or(c.Workers, 128)
	c.InFlightLimit = cmp.Or(c.InFlightLimit, LimitAdaptive)
	c.MaxInFlightPerSubscription = cmp.Or(c.MaxInFlightPerSubscription, 64)
	c.Timeout = cmp.Or(c.Timeout, 15*time.Second)
	if c.RetrySchedule == nil {
		c.RetrySchedule = delivery.DefaultRetrySchedule
	}
	c.MaxBufferedBytes = cmp.Or(c.MaxBufferedBytes, 64<<20)
	c.IsolateAfter = cmp.Or(c.IsolateAfter, 2*time.Second)
	c.HoldLimit = cmp.Or(c.HoldLimit, 10*time.Second)
	c.MaxWaiting = cmp.Or(c.MaxWaiting, 10_000)
	c.MaxWaitingBytes = cmp.Or(c.MaxWaitingBytes, 16<<20)
	c.MaxWaitingAge = cmp.Or(c.MaxWaitingAge, 30*time.Second)
	c.IsolationPeriod = cmp.Or(c.IsolationPeriod, 30*time.Second)
	c.HandOverInterval = cmp.Or(c.HandOverInterval, 100*time.Millisecond)
	c.FetchMaxWait = cmp.Or(c.FetchMaxWait, 100*time.Millisecond)
	c.CommitInterval = cmp.Or(c.CommitInterval, 200*time.Millisecond)
	c.RefreshInterval = cmp.Or(c.RefreshInterval, time.Second)
	c.LogInterval = cmp.Or(c.LogInterval, 50*time.Millisecond)
	c.AttemptRetention = cmp.Or(c.AttemptRetention, 168*time.Hour)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, 5*time.Second)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, 6*time.Second)
	c.RebalanceTimeout = cmp.Or(c.RebalanceTimeout, 30*time.Second)
	if c.Logger == nil {
		c.Logger = logging.Discard()
	}
	if c.Metrics == nil {
		c.Metrics = noMetrics{}
	}
	c.ID = cmp.Or(c.ID, service.ReplicaID())
	return c
}

type noMetrics struct{}

func (noMetrics) Attempt(int, time.Duration, string) {}
func (noMetrics) SubscriptionDisabled()              {}
