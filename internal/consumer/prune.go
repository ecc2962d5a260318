package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxbridge/bridge/internal/database"
)

// pruneLoop prunes the inbox at start and every PruneInterval until ctx ends.
func (c *Consumer) pruneLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.PruneInterval)
	defer t.Stop()
	for {
		if _, err := c.PruneInbox(ctx); err != nil && !errors.Is(err, context.Canceled) {
			c.logger.WarnContext(ctx, "prune consumer inbox failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// PruneInbox deletes inbox rows older than the dedup window, PruneBatch rows
// per statement, until none are left; it returns how many it deleted.
func (c *Consumer) PruneInbox(ctx context.Context) (int64, error) {
	var total int64
	for {
		n, err := c.pruneOnce(ctx)
		total += n
		if err != nil {
			return total, err
		}
		if n < int64(c.cfg.PruneBatch) {
			if total > 0 {
				c.logger.InfoContext(ctx, "consumer inbox pruned", "rows", total, "older_than", c.cfg.DedupWindow)
			}
			return total, nil
		}
	}
}

func (c *Consumer) pruneOnce(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	tag, err := c.pool.Exec(ctx, pruneInbox, c.cfg.DedupWindow.Seconds(), c.cfg.PruneBatch)
	if err != nil {
		return 0, fmt.Errorf("prune consumer inbox: %w", err)
	}
	c.stats.inboxPruned.Add(tag.RowsAffected())
	return tag.RowsAffected(), nil
}
