package service

import (
	"context"
	"fmt"
	"time"
)

// Prune configures PruneInBatches.
type Prune struct {
	// Batch is the most rows one statement deletes, so a large cleanup never
	// holds many row locks or one long transaction. Required (> 0).
	Batch int
	// MaxBatches caps the statements of one call, spreading a huge first
	// cleanup over several rounds. 0: until a batch comes back short.
	MaxBatches int
	// Timeout bounds each statement. 0: no bound beyond ctx.
	Timeout time.Duration
}

// PruneInBatches calls deleteBatch(ctx, p.Batch) until it deletes fewer than
// p.Batch rows (nothing left), MaxBatches is reached, or it fails, and
// returns the total deleted. deleteBatch is one bounded DELETE, typically
// `DELETE … WHERE ctid IN (SELECT ctid … LIMIT $n)`.
func PruneInBatches(ctx context.Context, p Prune, deleteBatch func(ctx context.Context, limit int) (int64, error)) (int64, error) {
	if p.Batch <= 0 {
		return 0, fmt.Errorf("service.PruneInBatches: batch must be positive, got %d", p.Batch)
	}
	var total int64
	for i := 0; p.MaxBatches <= 0 || i < p.MaxBatches; i++ {
		n, err := func() (int64, error) {
			qctx, cancel := ctx, context.CancelFunc(func() {})
			if p.Timeout > 0 {
				qctx, cancel = context.WithTimeout(ctx, p.Timeout)
			}
			defer cancel()
			return deleteBatch(qctx, p.Batch)
		}()
		total += n
		if err != nil {
			return total, err
		}
		if n < int64(p.Batch) {
			break
		}
	}
	return total, nil
}
