// Package progress tells a stage that is stuck from one that is idle: a
// stage that has made no progress for a configured time while work is
// waiting for it reports not ready on /readyz (the reason in the check's
// JSON error) and exports how long it has been stuck. A consumer retrying
// one batch forever, or a deliverer whose claims keep failing, is alive and
// can reach PostgreSQL and Kafka, so no other check notices it.
package progress

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outboxbridge/bridge/internal/opsserver"
)

// Watch watches one stage. Fill in the exported fields, then use Check and
// Stalled; they are safe for concurrent use.
type Watch struct {
	// Stage names the stage ("consume", "deliver"): the check is
	// "<stage>_progress" and the metric's stage label.
	Stage string
	// After is how long the stage may go without progress while work
	// waits before it is stuck (READY_STALL_TIMEOUT). 0 turns the check
	// off (Stalled still measures).
	After time.Duration
	// Count returns a number that grows whenever the stage makes progress
	// (records handled, claims and outcomes written).
	Count func() int64
	// Waiting says whether work is waiting for the stage, and how much, in
	// words for the reason ("120 records polled"). "" means nothing waits.
	Waiting func(ctx context.Context) (string, error)

	now   func() time.Time // tests; nil: time.Now
	mu    sync.Mutex
	init  bool
	last  int64     // Count at the last change
	since time.Time // when the stage last made progress or had nothing waiting
}

// Stalled returns how long the stage has made no progress while work waits
// (0: not stalled) and what is waiting.
func (w *Watch) Stalled(ctx context.Context) (time.Duration, string, error) {
	now := time.Now()
	if w.now != nil {
		now = w.now()
	}
	n := w.Count()
	waiting, err := w.Waiting(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.init || n != w.last || (err == nil && waiting == "") {
		w.init, w.last, w.since = true, n, now
	}
	if err != nil {
		return 0, "", fmt.Errorf("%s: is work waiting: %w", w.Stage, err)
	}
	if waiting == "" {
		return 0, "", nil
	}
	return now.Sub(w.since), waiting, nil
}

// Check is the /readyz check "<stage>_progress": it fails when the stage
// has been stalled for After or longer, saying for how long and what
// waits. An error finding out whether work waits does not fail it (the
// postgres check reports PostgreSQL itself).
func (w *Watch) Check() opsserver.Check {
	return opsserver.Check{Name: w.Stage + "_progress", Run: func(ctx context.Context) error {
		d, waiting, err := w.Stalled(ctx)
		if err != nil || w.After <= 0 || d < w.After {
			return nil
		}
		return fmt.Errorf("%s made no progress for %s while %s (READY_STALL_TIMEOUT=%s)", w.Stage, d.Truncate(time.Second), waiting, w.After)
	}}
}
