package delivery

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/service"
)

// ReclaimerConfig configures the Reclaimer.
type ReclaimerConfig struct {
	// Interval between two rounds. Default 15s (the deliverer passes its
	// ReclaimInterval: WEBHOOK_LEASE/4, at most 15s).
	Interval time.Duration
	// Batch: claims returned by one statement at most. Default 1000.
	Batch int
	// Timeout bounds one round. Default 30s.
	Timeout time.Duration
	// MaxAttempts: a reclaimed delivery that has had this many attempts is
	// dead rather than pending. Default len(DefaultRetrySchedule)+1.
	MaxAttempts int
	// Wake is called after a round that returned deliveries to pending, so
	// the claim loops take them at once. Default: nothing.
	Wake func()
	// Logger. Default: discard.
	Logger *slog.Logger
}

func (c ReclaimerConfig) withDefaults() ReclaimerConfig {
	c.Interval = cmp.Or(c.Interval, 15*time.Second)
	c.Batch = cmp.Or(c.Batch, 1000)
	c.Timeout = cmp.Or(c.Timeout, queryTimeout)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, len(DefaultRetrySchedule)+1)
	if c.Wake == nil {
		c.Wake = func() {}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Reclaimer is the service that runs reclaim_stalled: a claim whose lease
// expired (its deliverer was killed, or lost PostgreSQL) goes back to
// pending with its attempt kept, since the request may have arrived —
// without it, that claim would hold its stream forever.
type Reclaimer struct {
	cfg   ReclaimerConfig
	store *store.DeliveryStore
}

// NewReclaimer returns a Reclaimer on st; zero fields of cfg take their
// defaults.
func NewReclaimer(st *store.DeliveryStore, cfg ReclaimerConfig) *Reclaimer {
	return &Reclaimer{cfg: cfg.withDefaults(), store: st}
}

func (r *Reclaimer) Name() string { return "reclaim stalled deliveries" }

// Run reclaims every Interval until ctx ends.
func (r *Reclaimer) Run(ctx context.Context) {
	service.Every(ctx, service.Loop{Name: r.Name(), Interval: r.cfg.Interval, Timeout: r.cfg.Timeout, Logger: r.cfg.Logger}, r.RunOnce)
}

// RunOnce is one round.
func (r *Reclaimer) RunOnce(ctx context.Context) error {
	pending, dead, err := r.store.ReclaimStalled(ctx, r.cfg.Batch, r.cfg.MaxAttempts)
	if err != nil {
		return err
	}
	if pending+dead > 0 {
		r.cfg.Logger.WarnContext(ctx, "reclaimed deliveries whose lease expired (attempt kept)", "to_pending", pending, "dead", dead)
		r.cfg.Wake()
	}
	return nil
}
