package service_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/service"
	"github.com/outboxbridge/bridge/internal/testkit"
)

func newLogger() (*slog.Logger, *testkit.LogBuffer) {
	b := &testkit.LogBuffer{}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

func TestBackoffDelay(t *testing.T) {
	t.Parallel()
	b := service.Backoff{Base: 100 * time.Millisecond, Max: time.Second, Jitter: -1}
	for _, tc := range []struct {
		attempt int
		want    time.Duration
	}{
		{0, 100 * time.Millisecond},
		{1, 100 * time.Millisecond},
		{2, 200 * time.Millisecond},
		{3, 400 * time.Millisecond},
		{4, 800 * time.Millisecond},
		{5, time.Second},
		{60, time.Second}, // no overflow past the cap
	} {
		if got := b.Delay(tc.attempt); got != tc.want {
			t.Errorf("Delay(%d) = %s, want %s", tc.attempt, got, tc.want)
		}
	}
}

func TestBackoffJitterStaysInBounds(t *testing.T) {
	t.Parallel()
	b := service.Backoff{Base: time.Second, Max: time.Second, Jitter: 0.2}
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := b.Delay(3)
		if d < 800*time.Millisecond || d > 1200*time.Millisecond {
			t.Fatalf("Delay = %s, outside 1s ±20%%", d)
		}
		seen[d] = true
	}
	if len(seen) < 10 {
		t.Fatalf("jitter produced only %d distinct delays", len(seen))
	}
	// The zero value has defaults: 100ms ±20%.
	if d := (service.Backoff{}).Delay(1); d < 80*time.Millisecond || d > 120*time.Millisecond {
		t.Fatalf("zero Backoff Delay(1) = %s, want 100ms ±20%%", d)
	}
}

func TestEveryRunsUntilCancelledAndBoundsEachRun(t *testing.T) {
	t.Parallel()
	log, buf := newLogger()
	ctx, cancel := context.WithCancel(context.Background())
	var runs atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		service.Every(ctx, service.Loop{Name: "tick", Interval: 10 * time.Millisecond, Timeout: 20 * time.Millisecond, Immediate: true, Logger: log},
			func(ctx context.Context) error {
				n := runs.Add(1)
				if n == 2 {
					// A run that overstays its timeout is cut off and logged.
					<-ctx.Done()
					return ctx.Err()
				}
				if n == 3 {
					return errors.New("boom")
				}
				return nil
			})
	}()
	testkit.Eventually(t, 5*time.Second, func() string {
		return testkit.Unless(runs.Load() >= 5, "runs = %d, want ≥ 5", runs.Load())
	})
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Every did not return after cancel")
	}
	out := buf.String()
	if strings.Count(out, "tick failed") != 2 || !strings.Contains(out, "boom") || !strings.Contains(out, "deadline exceeded") {
		t.Fatalf("want two failures logged (the timeout and boom), got:\n%s", out)
	}
}

func TestEveryDoesNotLogShutdownAsFailure(t *testing.T) {
	t.Parallel()
	log, buf := newLogger()
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		service.Every(ctx, service.Loop{Name: "tick", Interval: time.Hour, Immediate: true, Logger: log}, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return fmt.Errorf("query: %w", ctx.Err())
		})
	}()
	<-started
	cancel()
	<-done
	if out := buf.String(); out != "" {
		t.Fatalf("shutdown logged as a failure:\n%s", out)
	}
}

func TestPruneInBatchesStopsOnShortBatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		rows       int64
		maxBatches int
		wantTotal  int64
		wantCalls  int
	}{
		{"empty", 0, 0, 0, 1},
		{"exact multiple needs one empty batch", 20, 0, 20, 3},
		{"remainder", 25, 0, 25, 3},
		{"capped", 1000, 4, 40, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			left, calls := tc.rows, 0
			total, err := service.PruneInBatches(context.Background(), service.Prune{Batch: 10, MaxBatches: tc.maxBatches, Timeout: time.Second},
				func(ctx context.Context, limit int) (int64, error) {
					calls++
					if _, ok := ctx.Deadline(); !ok {
						t.Error("batch without a deadline")
					}
					n := min(left, int64(limit))
					left -= n
					return n, nil
				})
			if err != nil || total != tc.wantTotal || calls != tc.wantCalls {
				t.Fatalf("total %d, calls %d, err %v; want %d, %d", total, calls, err, tc.wantTotal, tc.wantCalls)
			}
		})
	}
	boom := errors.New("boom")
	total, err := service.PruneInBatches(context.Background(), service.Prune{Batch: 10}, func(context.Context, int) (int64, error) { return 3, boom })
	if !errors.Is(err, boom) || total != 3 {
		t.Fatalf("got %d, %v; want 3 and boom", total, err)
	}
}

func TestRetryLogsEachFailureClassOncePerInterval(t *testing.T) {
	t.Parallel()
	log, buf := newLogger()
	var calls int
	err := service.Retry(context.Background(), service.Wait{
		Name: "connect", Backoff: service.Backoff{Base: time.Millisecond, Max: time.Millisecond}, LogEvery: time.Hour, Logger: log,
	}, func(context.Context) error {
		calls++
		switch {
		case calls < 10:
			return errors.New("connection refused")
		case calls < 20:
			return errors.New("password authentication failed")
		}
		return nil
	})
	if err != nil || calls != 20 {
		t.Fatalf("Retry = %v after %d calls, want nil after 20", err, calls)
	}
	out := buf.String()
	if strings.Count(out, "connection refused") != 1 || strings.Count(out, "password authentication failed") != 1 || !strings.Contains(out, "succeeded after retrying") {
		t.Fatalf("want one line per failure class and one recovery line, got:\n%s", out)
	}
}

func TestRetryGivesUpAfterTimeout(t *testing.T) {
	t.Parallel()
	start := time.Now()
	boom := errors.New("connection refused")
	err := service.Retry(context.Background(), service.Wait{Name: "connect", Timeout: 200 * time.Millisecond, Backoff: service.Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond}},
		func(context.Context) error { return boom })
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "still failing after 200ms") {
		t.Fatalf("err = %v", err)
	}
	if took := time.Since(start); took < 200*time.Millisecond || took > 2*time.Second {
		t.Fatalf("gave up after %s, want ≈200ms", took)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := service.Retry(ctx, service.Wait{Name: "connect"}, func(context.Context) error { return boom }); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Retry = %v, want context.Canceled", err)
	}
}

func TestReplicaIDIsUnique(t *testing.T) {
	t.Parallel()
	a, b := service.ReplicaID(), service.ReplicaID()
	if a == b || strings.Count(a, "/") != 2 {
		t.Fatalf("ReplicaID: %q, %q", a, b)
	}
}

// TestListenWakesAndReconnects: a NOTIFY wakes the reader; when the server
// kills the LISTEN connection, Listen reconnects, wakes the reader once for
// the gap, and later notifications arrive again.
func TestListenWakesAndReconnects(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log, buf := newLogger()
	wake := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		service.Listen(ctx, service.Listener{Pool: db.Pool, Channel: "kit_test", Logger: log,
			Backoff: service.Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond}}, wake)
	}()
	listening := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'`).Scan(&n); err != nil {
			t.Fatalf("pg_stat_activity: %v", err)
		}
		return n
	}
	awaitWake := func(what string) {
		t.Helper()
		select {
		case <-wake:
		case <-time.After(10 * time.Second):
			t.Fatalf("no wake-up for %s", what)
		}
	}
	awaitWake("the first connect")
	testkit.Eventually(t, 10*time.Second, func() string { return testkit.Unless(listening() == 1, "listening connections: %d", listening()) })
	notify := func() {
		if _, err := db.Pool.Exec(ctx, `NOTIFY kit_test`); err != nil {
			t.Fatalf("notify: %v", err)
		}
	}
	notify()
	awaitWake("a NOTIFY")

	if _, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'`); err != nil {
		t.Fatalf("terminate: %v", err)
	}
	awaitWake("the reconnect")
	testkit.Eventually(t, 10*time.Second, func() string { return testkit.Unless(listening() == 1, "listening connections: %d", listening()) })
	// Drain a wake-up a NOTIFY may have raced with, then prove the new
	// connection delivers.
	select {
	case <-wake:
	default:
	}
	notify()
	awaitWake("a NOTIFY after the reconnect")
	cancel()
	<-done
	if out := buf.String(); !strings.Contains(out, "LISTEN connection lost") || !strings.Contains(out, "LISTEN connection back") {
		t.Fatalf("want the loss and the recovery logged, got:\n%s", out)
	}
}
