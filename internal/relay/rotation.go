package relay

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/outboxstore"
	"github.com/outboxbridge/bridge/internal/service"
)

// Rotation is the outbox log's retention, one background service: it
// rotates the log's four tables (bridge.outbox_log_rotate) — the table after
// the current one is truncated whole and takes the new events — once the
// current one has taken events for half of Retention. A table is truncated
// only when every lane has passed every row in it, it stopped taking events
// at least Retention ago, and no transaction can still be inserting into it
// (it is locked ACCESS EXCLUSIVE first, waiting at most LockWait). So an
// event is kept between Retention and about twice that, and no row is
// ever deleted one by one. Every replica runs one; the table's row lock
// makes them take turns.
type Rotation struct {
	Pool      *pgxpool.Pool
	Retention time.Duration // default 24h
	// Interval between checks; default Retention/10, between 100 ms and a minute.
	Interval time.Duration
	// LockWait bounds the wait for the table's lock (readers queue behind
	// it meanwhile); default 200 ms.
	LockWait time.Duration
	Logger   *slog.Logger
}

func (o *Rotation) withDefaults() Rotation {
	c := *o
	c.Retention = cmp.Or(c.Retention, 24*time.Hour)
	c.Interval = cmp.Or(c.Interval, min(max(c.Retention/10, 100*time.Millisecond), time.Minute))
	c.LockWait = cmp.Or(c.LockWait, 200*time.Millisecond)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// Run rotates until ctx is done.
func (o *Rotation) Run(ctx context.Context) {
	c := o.withDefaults()
	service.Every(ctx, service.Loop{Name: "outbox log rotation", Interval: c.Interval, Logger: c.Logger}, c.step)
}

// step rotates once if the current table has taken events for Retention/2.
func (c Rotation) step(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	// Held rows that went out are kept for the retention, like the log.
	if _, err := service.PruneInBatches(ctx, service.Prune{Batch: 5000, Timeout: database.QueryTimeout},
		func(ctx context.Context, limit int) (int64, error) {
			return outboxstore.DeleteHeldSent(ctx, c.Pool, c.Retention, limit)
		}); err != nil {
		return err
	}
	_, since, err := outboxstore.CurrentTable(qctx, c.Pool)
	if err != nil || time.Since(since) < c.Retention/2 {
		return err
	}
	tbl, err := outboxstore.Rotate(qctx, c.Pool, c.Retention, c.LockWait)
	if err == nil && tbl >= 0 {
		c.Logger.DebugContext(ctx, "outbox log rotated", "current_table", tbl)
	}
	return err
}

// RotateOnce runs one rotation step now, whatever the current table's age
// (operators' and tests' use), and returns the new current table or -1.
func RotateOnce(ctx context.Context, pool *pgxpool.Pool, retention time.Duration) (int, error) {
	return outboxstore.Rotate(ctx, pool, retention, 200*time.Millisecond)
}
