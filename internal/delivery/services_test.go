package delivery

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

// TestEveryServiceHasItsDefaults: a zero config takes each documented
// default, so a service built without one runs as the deliverer's does.
func TestEveryServiceHasItsDefaults(t *testing.T) {
	if c := (ReclaimerConfig{}).withDefaults(); c.Interval != 15*time.Second || c.Batch != 1000 || c.Timeout != queryTimeout ||
		c.MaxAttempts != len(DefaultRetrySchedule)+1 || c.Wake == nil || c.Logger == nil {
		t.Errorf("reclaimer defaults: %+v", c)
	}
	if c := (RetentionConfig{}).withDefaults(); c.Retention != 168*time.Hour || c.Interval != time.Minute || c.Batch != 1000 ||
		c.MaxBatches != 100 || c.BatchTimeout != queryTimeout || c.Logger == nil {
		t.Errorf("retention defaults: %+v", c)
	}
	if c := (HistoryCopierConfig{}).withDefaults(); c.Interval != time.Second || c.Batch != 500 || c.MaxBatches != 200 ||
		c.Wake == nil || c.Logger == nil {
		t.Errorf("history copier defaults: %+v", c)
	}
	if c := (NotifierConfig{}).withDefaults(); c.Channel != "bridge_deliveries" || c.Wake == nil || c.Logger == nil {
		t.Errorf("notifier defaults: %+v", c)
	}
}

// TestDelivererServicesAreOnePerJob: the deliverer runs one service per
// background job, each named once, with the deliverer's settings.
func TestDelivererServicesAreOnePerJob(t *testing.T) {
	d, err := NewDeliverer(nil, Config{Lease: time.Minute, Timeout: time.Second, ReclaimInterval: 3 * time.Second, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, s := range d.Services() {
		if seen[s.Name()] {
			t.Errorf("two services named %q", s.Name())
		}
		seen[s.Name()] = true
		switch s := s.(type) {
		case *Reclaimer:
			if s.cfg.Interval != 3*time.Second {
				t.Errorf("reclaimer interval %v, want the deliverer's 3s", s.cfg.Interval)
			}
		case *Retention:
			if s.cfg.Retention != time.Hour {
				t.Errorf("retention %v, want the deliverer's 1h", s.cfg.Retention)
			}
		}
	}
	for _, want := range []string{"deliver", "listen for new deliveries", "reclaim stalled deliveries", "delivery retention", "subscription history"} {
		if !seen[want] {
			t.Errorf("no %q service (have %v)", want, seen)
		}
	}
}

type blockingService struct {
	name    string
	linger  time.Duration
	stopped *atomic.Int32
}

func (b blockingService) Name() string { return b.name }
func (b blockingService) Run(ctx context.Context) {
	<-ctx.Done()
	time.Sleep(b.linger) // winding down its own work
	b.stopped.Add(1)
}

// TestSuperviseReturnsOnlyWhenEveryServiceStopped: the supervisor's
// return is what lets Run release claims; a service still winding down
// must hold it.
func TestSuperviseReturnsOnlyWhenEveryServiceStopped(t *testing.T) {
	var stopped atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	Supervise(ctx, slog.New(slog.DiscardHandler),
		blockingService{"quick", 0, &stopped}, blockingService{"slow", 50 * time.Millisecond, &stopped})
	if n := stopped.Load(); n != 2 {
		t.Fatalf("Supervise returned with %d of 2 services stopped", n)
	}
}
