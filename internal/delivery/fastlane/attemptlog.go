package fastlane

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// The attempt log: every attempt of the fast lane, appended in batches.

// logAttempt queues the attempt for the attempt log. l.mu held.
func (l *Lane) logAttempt(it *item, res delivery.AttemptResult) {
	m := &it.rec.msg
	l.attempts = append(l.attempts, store.FastAttempt{
		SubscriptionID: it.sub, EventID: m.DedupID, EventType: m.EventType, Topic: it.rec.rec.Topic,
		Partition: it.rec.rec.Partition, Offset: it.rec.rec.Offset, AssetID: m.AssetID, Attempt: 1, Outcome: res.Outcome,
	})
}

// logBatchRows and logMaxWaits: the attempt-log service appends once
// logBatchRows attempts are queued, or once logMaxWaits LogIntervals have
// passed since its last append with any queued. A flush has a fixed cost in
// both processes (a COPY, a round trip, a transaction) besides its rows:
// appended every LogInterval whatever was queued, each member of a group
// paid it as often as a single member did for a third of the rows, and
// PostgreSQL's CPU per delivery grew with the members (7 → 9.5 µs with
// three). Counted in rows, the flushes of the group are those of one member.
const (
	logBatchRows = 1000
	logMaxWaits  = 4
)

// flushLogDue is one round of the attempt-log service: flushLog when a batch
// is due (see logBatchRows).
func (l *Lane) flushLogDue(ctx context.Context) error {
	l.mu.Lock()
	queued := len(l.attempts) + len(l.forgive)
	due := queued >= logBatchRows || (queued > 0 && time.Since(l.logFlushed) >= logMaxWaits*l.cfg.LogInterval)
	l.mu.Unlock()
	if !due {
		return nil
	}
	return l.flushLog(ctx)
}

// flushLog appends the queued attempts in one statement.
func (l *Lane) flushLog(ctx context.Context) error {
	l.mu.Lock()
	l.logFlushed = time.Now()
	// Two buffers take turns: the one being written to PostgreSQL and the
	// one filling, so the log's slice is not grown again every flush.
	as := l.attempts
	l.attempts, l.spareAttempts = l.spareAttempts[:0], nil
	var forgive []string
	for id := range l.forgive {
		forgive = append(forgive, id)
	}
	clear(l.forgive)
	l.mu.Unlock()
	if len(as) == 0 && len(forgive) == 0 {
		return nil
	}
	// A flush under way finishes even when the lane is stopping (its
	// context is cancelled then): cut short, its lines would be lost, and
	// the last flush at shutdown only takes what is still queued.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err := l.store.LogFastAttempts(wctx, as, forgive)
	l.stats.logFlushes.Add(1)
	l.stats.logRows.Add(int64(len(as)))
	clear(as) // no strings kept alive by the spare buffer
	l.mu.Lock()
	if l.spareAttempts == nil {
		l.spareAttempts = as[:0]
	}
	l.mu.Unlock()
	if err != nil {
		// The deliveries are done either way; the log misses these lines.
		return fmt.Errorf("%d attempts not logged: %w", len(as), err)
	}
	return nil
}

// maintainPartitions is one round of the AttemptPartitions service.
func (l *Lane) maintainPartitions(ctx context.Context) error { return l.partitions().RunOnce(ctx) }

// partitions is the lane's AttemptPartitions service.
func (l *Lane) partitions() *AttemptPartitions {
	return NewAttemptPartitions(l.store, AttemptPartitionsConfig{Retention: l.cfg.AttemptRetention, Logger: l.log})
}
