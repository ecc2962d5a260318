package relay

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/outboxstore"
)

// StatementCeiling drains every NEW row of pool's outbox through the relay's
// own PostgreSQL statements alone — lease and fence, the claim (payloads
// returned, the per-asset hold, the resume cursor), the predecessor check and
// the fenced mark — one after the other, with a made-up partition and offset
// instead of a Kafka round trip. It returns how many rows it marked and how
// long that took: the database's ceiling for this relay's bookkeeping, which
// a benchmark reports next to the drain (the relay overlaps the mark with the
// next claim and produce, so it can come close to it but not pass it by
// much). Run it on a scratch database with no relay running.
func StatementCeiling(ctx context.Context, pool *pgxpool.Pool, cfg Config) (int, time.Duration, error) {
	r := New(pool, nil, cfg)
	// Claims planned as the relay would plan them here (refreshStats does
	// not run in the ceiling).
	if st, err := outboxstore.ReadOutboxStats(ctx, pool); err == nil {
		r.freshPlans.Store(st.Stale || st.Rows < freshPlansBelow)
	}
	if err := r.lanes.tick(ctx); err != nil {
		return 0, 0, err
	}
	defer r.lanes.releaseAll(context.WithoutCancel(ctx))
	// The claim asks the fence for half a lease left: keep the leases up, as
	// the relay does.
	keepCtx, stopKeeping := context.WithCancel(ctx)
	var keeper sync.WaitGroup
	keeper.Add(1)
	go func() { defer keeper.Done(); r.keepLanes(keepCtx) }()
	defer func() { stopKeeping(); keeper.Wait() }()
	lanes := r.lanes.Owned()
	if len(lanes) != LaneCount {
		return 0, 0, errors.New("statement ceiling: another relay holds lanes of this database")
	}
	marked := 0
	start := time.Now()
	for {
		claimed, _, err := r.claim(ctx, lanes, nil)
		if err != nil {
			return marked, time.Since(start), err
		}
		if len(claimed) == 0 {
			return marked, time.Since(start), nil
		}
		rows := r.inOrder(claimed, nil)
		idx := make([]int, len(rows))
		results := make([]sendResult, len(rows))
		for i := range rows {
			idx[i] = i
			results[i] = sendResult{partition: int32(i % 6), offset: int64(marked + i)}
		}
		if err := r.markSent(ctx, rows, idx, results); err != nil {
			return marked, time.Since(start), err
		}
		marked += len(rows)
	}
}
