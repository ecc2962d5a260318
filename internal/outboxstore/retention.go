package outboxstore

import (
	"context"
	"fmt"
	"time"
)

// deleteSentSQL removes SENT rows past retention in bounded batches, so the
// table (and the claim's index) stays small without one huge DELETE holding
// locks and bloating WAL. SKIP LOCKED: every relay replica prunes on its own
// tick; without it two replicas pick the same oldest rows, the second waits on
// the first's row locks (or, locking them in another order, deadlocks with
// it), and a row an operator is replaying right now would hold the prune up.
const deleteSentSQL = `
DELETE FROM bridge.outbox
WHERE id IN (
  SELECT id FROM bridge.outbox
  WHERE status = 'SENT' AND sent_at < now() - $1::interval
  ORDER BY sent_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED)`

// DeleteSentChunk is how many rows one retention statement deletes (a
// bounded DELETE holds its locks briefly and keeps WAL bursts small).
const DeleteSentChunk = 5000

// DeleteSentBatch deletes up to limit SENT rows older than retention and
// returns how many it removed.
func DeleteSentBatch(ctx context.Context, db DB, retention time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, deleteSentSQL, Interval(retention), limit)
	if err != nil {
		return 0, fmt.Errorf("delete sent outbox rows: %w", err)
	}
	return tag.RowsAffected(), nil
}
