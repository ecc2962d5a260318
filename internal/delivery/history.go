package delivery

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/service"
)

// HistoryCopierConfig configures the HistoryCopier.
type HistoryCopierConfig struct {
	// Interval between two rounds; the first runs at start. Default 1s
	// (the deliverer passes WEBHOOK_POLL_INTERVAL).
	Interval time.Duration
	// Batch: outbox rows one transaction looks at, so a long history never
	// holds a transaction open or a connection for long. Default 500.
	Batch int
	// MaxBatches a round, so shutdown is never kept waiting. Default 200.
	MaxBatches int
	// Copy is one round's step: it copies a batch of one subscription's
	// history and says whether there was one (ok). Default: from the
	// retained outbox rows (store.CopyHistory, Batch rows looked at); with
	// the fast lane on, the deliverer reads the topics by time instead
	// (kafkawindow.Source.CopyHistory).
	Copy func(ctx context.Context) (b store.HistoryBatch, ok bool, err error)
	// Wake is called when a subscription's history is complete (its
	// deliveries may be claimed from then on). Default: nothing.
	Wake func()
	// Logger. Default: discard.
	Logger *slog.Logger
}

func (c HistoryCopierConfig) withDefaults() HistoryCopierConfig {
	c.Interval = cmp.Or(c.Interval, time.Second)
	c.Batch = cmp.Or(c.Batch, 500)
	c.MaxBatches = cmp.Or(c.MaxBatches, 200)
	if c.Wake == nil {
		c.Wake = func() {}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// HistoryCopier is the service that copies the history of subscriptions
// created with --since into bridge.deliveries: from the outbox, a bounded
// batch per transaction with its cursor (store.CopyHistory), so a crashed
// copy resumes where its last batch committed; with the fast lane on, from
// the topics by time (kafkawindow).
type HistoryCopier struct {
	cfg   HistoryCopierConfig
	store *store.DeliveryStore
}

// NewHistoryCopier returns a HistoryCopier on st; zero fields of cfg take
// their defaults.
func NewHistoryCopier(st *store.DeliveryStore, cfg HistoryCopierConfig) *HistoryCopier {
	cfg = cfg.withDefaults()
	if cfg.Copy == nil {
		batch := cfg.Batch
		cfg.Copy = func(ctx context.Context) (store.HistoryBatch, bool, error) { return st.CopyHistory(ctx, batch) }
	}
	return &HistoryCopier{cfg: cfg, store: st}
}

func (h *HistoryCopier) Name() string { return "subscription history" }

// Run copies every Interval (and once at start) until ctx ends.
func (h *HistoryCopier) Run(ctx context.Context) {
	service.Every(ctx, service.Loop{Name: h.Name(), Interval: h.cfg.Interval, Logger: h.cfg.Logger, Immediate: true}, h.RunOnce)
}

// RunOnce copies up to MaxBatches batches.
func (h *HistoryCopier) RunOnce(ctx context.Context) error {
	for range h.cfg.MaxBatches {
		b, ok, err := h.cfg.Copy(ctx)
		if err != nil || !ok {
			return err
		}
		if b.Done {
			h.cfg.Logger.InfoContext(ctx, "subscription history copied; its deliveries start", "subscription_id", b.SubscriptionID)
			h.cfg.Wake()
		}
	}
	return nil
}
