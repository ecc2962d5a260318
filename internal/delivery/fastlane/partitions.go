package fastlane

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/service"
)

// AttemptPartitionsConfig configures the AttemptPartitions service.
type AttemptPartitionsConfig struct {
	// Interval between two rounds; the first runs at start. Default 1h.
	Interval time.Duration
	// Ahead: days of partitions created ahead of today (yesterday's is
	// always kept). Default 2.
	Ahead int
	// Retention: day partitions that end before now minus this are dropped
	// (WEBHOOK_RETENTION). Default 168h.
	Retention time.Duration
	// Timeout bounds one round. Default 1m.
	Timeout time.Duration
	// Logger. Default: discard.
	Logger *slog.Logger
}

func (c AttemptPartitionsConfig) withDefaults() AttemptPartitionsConfig {
	c.Interval = cmp.Or(c.Interval, time.Hour)
	c.Ahead = cmp.Or(c.Ahead, 2)
	c.Retention = cmp.Or(c.Retention, 168*time.Hour)
	c.Timeout = cmp.Or(c.Timeout, time.Minute)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// AttemptPartitions is the service that keeps the day partitions of the
// fast lane's attempt log (bridge.webhook_attempts): created Ahead days
// ahead, dropped whole past Retention — retention without a DELETE. Every
// member runs it; advisory lock 7411006, taken per transaction, serialises
// their DDL, so there is no leader to lose (docs/architecture.md).
type AttemptPartitions struct {
	cfg   AttemptPartitionsConfig
	store *store.DeliveryStore
}

// NewAttemptPartitions returns the service on st; zero fields of cfg take
// their defaults.
func NewAttemptPartitions(st *store.DeliveryStore, cfg AttemptPartitionsConfig) *AttemptPartitions {
	return &AttemptPartitions{cfg: cfg.withDefaults(), store: st}
}

func (a *AttemptPartitions) Name() string { return "attempt log partitions" }

// Run keeps the partitions every Interval (and at start) until ctx ends.
func (a *AttemptPartitions) Run(ctx context.Context) {
	service.Every(ctx, service.Loop{Name: a.Name(), Interval: a.cfg.Interval, Immediate: true, Timeout: a.cfg.Timeout,
		Logger: a.cfg.Logger}, a.RunOnce)
}

// RunOnce creates the partitions ahead and drops those past retention.
func (a *AttemptPartitions) RunOnce(ctx context.Context) error {
	now := time.Now()
	if err := a.store.EnsureAttemptPartitions(ctx, now, a.cfg.Ahead); err != nil {
		return err
	}
	dropped, err := a.store.DropAttemptPartitions(ctx, now.Add(-a.cfg.Retention))
	if len(dropped) > 0 {
		a.cfg.Logger.InfoContext(ctx, "dropped attempt log partitions past retention", "partitions", dropped)
	}
	return err
}
