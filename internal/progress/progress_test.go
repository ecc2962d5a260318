package progress

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// The watch's rule, on a clock the test moves: idle is never stuck; work
// waiting without progress is stuck after After; progress or an empty queue
// resets it; an error finding out what waits does not fail readiness.
func TestWatchTellsStuckFromIdle(t *testing.T) {
	now := time.Unix(1000, 0)
	var count int64
	waiting := ""
	var waitErr error
	w := &Watch{
		Stage: "deliver", After: time.Minute,
		Count:   func() int64 { return count },
		Waiting: func(context.Context) (string, error) { return waiting, waitErr },
		now:     func() time.Time { return now },
	}
	check := w.Check()
	step := func(d time.Duration) error { now = now.Add(d); return check.Run(context.Background()) }

	if err := step(0); err != nil {
		t.Fatalf("idle at start: %v", err)
	}
	if err := step(time.Hour); err != nil {
		t.Fatalf("idle for an hour: %v", err)
	}
	waiting = "3 deliveries are due"
	if err := step(59 * time.Second); err != nil {
		t.Fatalf("59s with work waiting: %v", err)
	}
	err := step(time.Second)
	if err == nil || !strings.Contains(err.Error(), "deliver made no progress for 1m0s while 3 deliveries are due") {
		t.Fatalf("60s stalled: %v", err)
	}
	if d, _, _ := w.Stalled(context.Background()); d != time.Minute {
		t.Errorf("Stalled = %s, want 1m", d)
	}
	count++ // progress
	if err := step(time.Second); err != nil {
		t.Fatalf("after progress: %v", err)
	}
	if err := step(59 * time.Second); err != nil {
		t.Fatalf("59s after progress: %v", err)
	}
	waitErr = errors.New("database down")
	if err := step(time.Hour); err != nil {
		t.Fatalf("unknown whether work waits: %v (the postgres check reports it)", err)
	}
	waitErr = nil
	if err := step(time.Minute); err == nil {
		t.Fatal("still stalled once the error cleared: want not ready")
	}
	waiting = ""
	if err := step(0); err != nil {
		t.Fatalf("queue emptied: %v", err)
	}
	w.After = 0
	waiting = "x"
	if err := step(24 * time.Hour); err != nil {
		t.Fatalf("READY_STALL_TIMEOUT=0 turns the check off: %v", err)
	}
}
