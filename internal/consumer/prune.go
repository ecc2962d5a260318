package consumer

import (
	"context"
	"fmt"

	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/service"
)

// pruneLoop prunes the inbox at start and every PruneInterval until ctx ends.
func (c *Consumer) pruneLoop(ctx context.Context) {
	service.Every(ctx, service.Loop{Name: "prune consumer inbox", Interval: c.cfg.PruneInterval, Immediate: true, Logger: c.logger},
		func(ctx context.Context) error {
			_, err := c.PruneInbox(ctx)
			return err
		})
}

// PruneInbox deletes inbox rows older than the dedup window, PruneBatch rows
// per statement, until none are left; it returns how many it deleted.
func (c *Consumer) PruneInbox(ctx context.Context) (int64, error) {
	total, err := service.PruneInBatches(ctx, service.Prune{Batch: c.cfg.PruneBatch, Timeout: database.QueryTimeout},
		func(ctx context.Context, limit int) (int64, error) {
			tag, err := c.pool.Exec(ctx, pruneInbox, c.cfg.DedupWindow.Seconds(), limit)
			if err != nil {
				return 0, fmt.Errorf("prune consumer inbox: %w", err)
			}
			c.stats.inboxPruned.Add(tag.RowsAffected())
			return tag.RowsAffected(), nil
		})
	if total > 0 {
		c.logger.InfoContext(ctx, "consumer inbox pruned", "rows", total, "older_than", c.cfg.DedupWindow)
	}
	return total, err
}
