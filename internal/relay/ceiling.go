package relay

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/outboxstore"
)

// StatementCeiling reads every pending event of pool's outbox through the
// relay's own PostgreSQL statements alone — lease and fence, the batch read
// (payloads returned, the held rows' check, the predecessor check) and the
// position saves — one after the other, with no Kafka. It returns how many
// events it read and how long that took: the database's ceiling for this
// relay's bookkeeping, which a benchmark reports next to the drain. Run it on
// a scratch database with no relay running.
func StatementCeiling(ctx context.Context, pool *pgxpool.Pool, cfg Config) (int, time.Duration, error) {
	r := New(pool, nil, cfg)
	if err := r.lanes.tick(ctx); err != nil {
		return 0, 0, err
	}
	defer r.lanes.releaseAll(context.WithoutCancel(ctx))
	keepCtx, stopKeeping := context.WithCancel(ctx)
	var keeper sync.WaitGroup
	keeper.Add(1)
	go func() { defer keeper.Done(); r.keepLanes(keepCtx) }()
	defer func() { stopKeeping(); keeper.Wait() }()
	lanes := r.lanes.Owned()
	if len(lanes) != LaneCount {
		return 0, 0, errors.New("statement ceiling: another relay holds lanes of this database")
	}
	read := 0
	start := time.Now()
	for {
		c, err := r.claim(ctx, lanes, nil)
		if err != nil {
			return read, time.Since(start), err
		}
		read += len(c.rows)
		if !c.more {
			break
		}
	}
	for _, p := range r.positionsNow() {
		if _, err := outboxstore.SavePosition(ctx, pool, r.cfg.MemberID, p.server, p.lanes, p.pos); err != nil {
			return read, time.Since(start), err
		}
	}
	return read, time.Since(start), nil
}
