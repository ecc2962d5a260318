package delivery

import (
	"context"
	"log/slog"
	"sync"
)

// Service is one background job of the deliverer, River-style: it has its
// own configuration with defaults, runs until ctx ends and returns only once
// its own work is wound down (a service that holds work, like the delivery
// pipeline, finishes or hands it back before returning). A service never
// fails for good: a failed round is logged and the next one runs, so one
// job's trouble (a statement timing out) stops no other job.
type Service interface {
	// Name says what the job does, in log lines.
	Name() string
	// Run works until ctx ends.
	Run(ctx context.Context)
}

// Supervise is the one lifecycle of a set of services: it starts each on
// its own goroutine and returns when every one of them has returned (after
// ctx ends). Nothing is restarted: a service's Run only returns at
// shutdown.
func Supervise(ctx context.Context, log *slog.Logger, services ...Service) {
	var wg sync.WaitGroup
	for _, s := range services {
		wg.Go(func() {
			log.DebugContext(ctx, "service started", "service", s.Name())
			s.Run(ctx)
			log.DebugContext(ctx, "service stopped", "service", s.Name())
		})
	}
	wg.Wait()
}
