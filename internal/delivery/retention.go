package delivery

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/service"
)

// RetentionConfig configures the Retention service.
type RetentionConfig struct {
	// Retention: delivered deliveries older than this are deleted with their
	// attempt log (WEBHOOK_RETENTION). Default 168h. Dead deliveries are
	// kept.
	Retention time.Duration
	// Interval between two rounds. Default 1m.
	Interval time.Duration
	// Batch: rows one DELETE takes at most, so no statement holds many row
	// locks or runs long. Default 1000.
	Batch int
	// MaxBatches a round, so a large first cleanup is spread out. Default
	// 100.
	MaxBatches int
	// BatchTimeout bounds one DELETE. Default 30s.
	BatchTimeout time.Duration
	// Logger. Default: discard.
	Logger *slog.Logger
}

func (c RetentionConfig) withDefaults() RetentionConfig {
	c.Retention = cmp.Or(c.Retention, envDefaults.Retention)
	c.Interval = cmp.Or(c.Interval, time.Minute)
	c.Batch = cmp.Or(c.Batch, 1000)
	c.MaxBatches = cmp.Or(c.MaxBatches, 100)
	c.BatchTimeout = cmp.Or(c.BatchTimeout, queryTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Retention is the service that applies WEBHOOK_RETENTION to the slow
// lane's tables: delivered deliveries past it (with their attempt log), then
// idle delivery streams, in bounded batches. (The fast lane's append-only
// bridge.webhook_attempts is kept by dropping day partitions instead; see
// internal/delivery/fastlane.)
type Retention struct {
	cfg   RetentionConfig
	store *store.DeliveryStore
}

// NewRetention returns a Retention on st; zero fields of cfg take their
// defaults.
func NewRetention(st *store.DeliveryStore, cfg RetentionConfig) *Retention {
	return &Retention{cfg: cfg.withDefaults(), store: st}
}

func (r *Retention) Name() string { return "delivery retention" }

// Run prunes every Interval until ctx ends.
func (r *Retention) Run(ctx context.Context) {
	service.Every(ctx, service.Loop{Name: r.Name(), Interval: r.cfg.Interval, Logger: r.cfg.Logger}, r.RunOnce)
}

// RunOnce is one round.
func (r *Retention) RunOnce(ctx context.Context) error {
	p := service.Prune{Batch: r.cfg.Batch, MaxBatches: r.cfg.MaxBatches, Timeout: r.cfg.BatchTimeout}
	total, err := service.PruneInBatches(ctx, p, func(ctx context.Context, limit int) (int64, error) {
		n, err := r.store.PruneDelivered(ctx, r.cfg.Retention, limit)
		return int64(n), err
	})
	if total > 0 {
		r.cfg.Logger.InfoContext(ctx, "deleted delivered deliveries past retention", "deleted", total, "retention", r.cfg.Retention)
	}
	if err != nil {
		return err
	}
	streams, err := service.PruneInBatches(ctx, p, func(ctx context.Context, limit int) (int64, error) {
		n, err := r.store.PruneIdleStreams(ctx, limit)
		return int64(n), err
	})
	if streams > 0 {
		r.cfg.Logger.DebugContext(ctx, "deleted idle delivery streams", "deleted", streams)
	}
	return err
}
