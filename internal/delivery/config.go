package delivery

import (
	"cmp"
	"log/slog"
	"net/netip"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/delivery/kafkawindow"
	"github.com/outboxbridge/bridge/internal/keyring"
	"github.com/outboxbridge/bridge/internal/service"
)

// envDefaults are the defaults of the fields read from the environment: the
// envDefault tags of config.Webhook, so each is written once, there (a test
// checks the comments below repeat them correctly).
var envDefaults = func() Config {
	c, err := ConfigFromEnv(config.Defaults().Webhook)
	if err != nil {
		panic("delivery: the WEBHOOK_* defaults do not map: " + err.Error())
	}
	return c
}()

// DefaultRetrySchedule is Svix's schedule (WEBHOOK_RETRY_SCHEDULE's
// default): immediately, 5s, 5m, 30m, 2h, 5h, 10h, 10h — nine attempts over
// about a day and a half.
var DefaultRetrySchedule = envDefaults.RetrySchedule

// Config configures a Deliverer. Every zero field takes the default named in
// its comment; a field read from the environment names its variable.
type Config struct {
	// RetrySchedule: delay before each retry; after the last one a failing
	// delivery is dead, so a delivery gets len(RetrySchedule)+1 attempts
	// (WEBHOOK_RETRY_SCHEDULE). nil: the default, 0s,5s,5m,30m,2h,5h,10h,10h
	// (DefaultRetrySchedule). A non-nil empty slice: no retries.
	RetrySchedule []time.Duration
	// DisableAfter: consecutive dead deliveries that disable a subscription
	// (WEBHOOK_DISABLE_AFTER). Default 5.
	DisableAfter int
	// Timeout of one HTTP attempt (WEBHOOK_TIMEOUT). Default 15s.
	Timeout time.Duration
	// Lease: how long a claim lasts; a delivery in flight longer goes back to
	// pending (keeping its attempt) (WEBHOOK_LEASE). Must exceed Timeout.
	// Default 60s, or twice Timeout when that is longer.
	Lease time.Duration
	// Workers: concurrent HTTP requests in total (WEBHOOK_WORKERS). Default
	// 128.
	Workers int
	// MaxInFlightPerSubscription bounds one subscription's share of the
	// workers, so a slow endpoint cannot occupy them all
	// (WEBHOOK_MAX_IN_FLIGHT_PER_SUBSCRIPTION). Default 64. It counts a
	// delivery until its outcome is written, not only while its request
	// runs, so it also bounds one subscription's rate at the cap ÷ the time
	// from claim to written outcome: at 32, ~50 ms of that on a busy 2-core
	// machine held `bench pipeline`'s subscriptions to ~650 deliveries/s
	// each, short of the 1,000/s offered.
	MaxInFlightPerSubscription int
	// ClaimLoops: claim statements that may run at once, each for its own
	// share of the subscriptions (by a hash of the id) (WEBHOOK_CLAIM_LOOPS).
	// Default 4.
	ClaimLoops int
	// ClaimBytes: payload bytes held at most — claimed, in a request or
	// waiting for the outcome to be written. A claim takes rows while the
	// budget left is not used up, and at least one, so a payload larger than
	// the budget is still delivered, alone (WEBHOOK_CLAIM_BYTES). Default
	// 16777216.
	ClaimBytes int
	// PollInterval: claim this often even without a NOTIFY (retries that come
	// due, missed notifications) (WEBHOOK_POLL_INTERVAL). Default 1s.
	PollInterval time.Duration
	// ReclaimInterval: how often stalled claims are looked for. Default
	// Lease/4, at most 15s.
	ReclaimInterval time.Duration
	// ShutdownGrace: on shutdown, how long requests in flight may finish
	// before they are cancelled and released (not charged)
	// (WEBHOOK_SHUTDOWN_GRACE). Default 5s.
	ShutdownGrace time.Duration
	// Retention: delivered deliveries older than this are deleted with their
	// attempt log, in batches, every PruneInterval (WEBHOOK_RETENTION).
	// Default 168h. Dead deliveries are kept.
	Retention time.Duration
	// PruneInterval: how often retention runs. Default 1m.
	PruneInterval time.Duration
	// OperationsTopic: deaths, the disables they cause and the staged
	// warnings are announced there, in the transaction that records the
	// death (BRIDGE_OPERATIONS_TOPIC). "": not announced.
	OperationsTopic string
	// Keys opens the sealed signing secrets (BRIDGE_SECRET_KEYS); nil opens
	// only plain-text ones.
	Keys *keyring.Ring
	// AllowedCIDRs are exempt from the SSRF block list (tests and local demos
	// set 127.0.0.0/8). Default none.
	AllowedCIDRs []netip.Prefix
	// TracerProvider records the client spans of webhook requests. nil: the
	// global provider. Without an SDK the stored traceparent still travels.
	TracerProvider trace.TracerProvider
	// Logger. nil: discard.
	Logger *slog.Logger
	// Metrics is told about every attempt and every disable (the runtime
	// passes metrics.Deliveries). nil: none.
	Metrics Metrics
	// ID names this deliverer in claimed_by. Default: service.ReplicaID().
	ID string
	// SyncSuccessCommit makes the transactions that record only successes
	// wait for their WAL flush, like every other write. Default false: they
	// commit with synchronous_commit = off. A PostgreSQL crash can then lose
	// the last few hundred milliseconds of success outcomes; those
	// deliveries are 'delivering' again, reclaim returns them with their
	// attempt kept and they go out once more with the same webhook-id —
	// at-least-once, which receivers dedup. Retries, deaths and disables
	// always wait for the flush: a death has been logged, counted and
	// traced, and a disable told to the operator, when it returns.
	SyncSuccessCommit bool
	// BreakerAfter: a subscription whose attempts failed on this many
	// different streams in a row is served one probe at a time until one
	// succeeds (see breakers). Default 10; negative: never.
	BreakerAfter int
	// ProbeInterval: while a subscription's breaker is open, at most one of
	// its due heads is claimed per interval. Default 1s.
	ProbeInterval time.Duration
	// HistoryFromKafka, set when the fast lane is on, is where the history
	// of subscriptions created with --since is read: the topics, by time.
	// nil: the retained outbox rows.
	HistoryFromKafka *kafkawindow.Source
}

// Metrics is the hook the Deliverer reports through; metrics.Deliveries
// implements it. Outcomes are "delivered", "retry" and "dead".
type Metrics interface {
	Attempt(statusCode int, duration time.Duration, outcome string)
	SubscriptionDisabled()
}

type noMetrics struct{}

func (noMetrics) Attempt(int, time.Duration, string) {}
func (noMetrics) SubscriptionDisabled()              {}

// ConfigFromEnv maps the WEBHOOK_* settings onto a Deliverer Config.
func ConfigFromEnv(c config.Webhook) (Config, error) {
	cidrs, err := c.ParsedAllowedCIDRs()
	if err != nil {
		return Config{}, err
	}
	schedule := c.RetrySchedule
	if schedule == nil {
		schedule = []time.Duration{}
	}
	breakerAfter := c.BreakerAfter
	if breakerAfter == 0 {
		breakerAfter = -1 // WEBHOOK_BREAKER_AFTER=0: never
	}
	return Config{
		RetrySchedule:              schedule,
		DisableAfter:               c.DisableAfter,
		BreakerAfter:               breakerAfter,
		ProbeInterval:              c.BreakerProbeInterval,
		Timeout:                    c.Timeout,
		Lease:                      c.Lease,
		Workers:                    c.Workers,
		MaxInFlightPerSubscription: c.MaxInFlightPerSubscription,
		ClaimLoops:                 c.ClaimLoops,
		ClaimBytes:                 c.ClaimBytes,
		PollInterval:               c.PollInterval,
		ShutdownGrace:              c.ShutdownGrace,
		Retention:                  c.Retention,
		AllowedCIDRs:               cidrs,
	}, nil
}

func (c Config) withDefaults() Config {
	if c.RetrySchedule == nil {
		c.RetrySchedule = DefaultRetrySchedule
	}
	d := envDefaults
	c.DisableAfter = cmp.Or(c.DisableAfter, d.DisableAfter)
	c.Timeout = cmp.Or(c.Timeout, d.Timeout)
	c.Lease = cmp.Or(c.Lease, max(d.Lease, 2*c.Timeout))
	c.Workers = cmp.Or(c.Workers, d.Workers)
	c.MaxInFlightPerSubscription = cmp.Or(c.MaxInFlightPerSubscription, d.MaxInFlightPerSubscription)
	c.PollInterval = cmp.Or(c.PollInterval, d.PollInterval)
	c.ClaimLoops = cmp.Or(c.ClaimLoops, d.ClaimLoops)
	c.ClaimBytes = cmp.Or(c.ClaimBytes, d.ClaimBytes)
	c.ReclaimInterval = cmp.Or(c.ReclaimInterval, min(c.Lease/4, 15*time.Second))
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, d.ShutdownGrace)
	c.Retention = cmp.Or(c.Retention, d.Retention)
	c.PruneInterval = cmp.Or(c.PruneInterval, time.Minute)
	c.BreakerAfter = cmp.Or(c.BreakerAfter, d.BreakerAfter)
	c.ProbeInterval = cmp.Or(c.ProbeInterval, d.ProbeInterval)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = noMetrics{}
	}
	c.ID = cmp.Or(c.ID, service.ReplicaID())
	return c
}

// maxAttempts is how many attempts a delivery gets before it dies.
func (c Config) maxAttempts() int { return len(c.RetrySchedule) + 1 }
