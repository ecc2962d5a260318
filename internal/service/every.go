package service

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/outboxbridge/bridge/internal/logging"
)

// Loop configures Every.
type Loop struct {
	// Name says what the job does, for the failure log ("prune consumer
	// inbox" logs "prune consumer inbox failed"). Required.
	Name string
	// Interval between the starts of two runs. Required (> 0).
	Interval time.Duration
	// Timeout bounds one run, so a stuck statement cannot stall the loop
	// forever; a run cut off by it is logged as a failure. 0: no bound
	// beyond ctx.
	Timeout time.Duration
	// Immediate runs the job once at start instead of after the first
	// Interval (retention after a restart should not wait an hour).
	Immediate bool
	// Logger receives one warning per failed run. Nil: discard.
	Logger *slog.Logger
	// Kick, if set, runs the job at once when it receives, between the
	// ticks (someone else changed what the job acts on and waiting out the
	// interval would leave it stale). Kicks that arrive during a run make
	// one more run after it, not one each: make the channel buffered
	// (capacity 1) and send without blocking.
	Kick <-chan struct{}
}

// Every runs job every l.Interval until ctx ends, and returns then. A failed
// run is logged and the loop goes on; an error that only says ctx ended
// (shutdown) is not a failure and is not logged. Runs never overlap: a run
// longer than Interval delays the next one.
func Every(ctx context.Context, l Loop, job func(context.Context) error) {
	if l.Interval <= 0 {
		panic("service.Every: Interval must be positive (" + l.Name + ")")
	}
	log := l.Logger
	if log == nil {
		log = logging.Discard()
	}
	run := func() {
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if l.Timeout > 0 {
			rctx, cancel = context.WithTimeout(ctx, l.Timeout)
		}
		defer cancel()
		if err := job(rctx); err != nil && !Stopping(ctx, err) {
			log.WarnContext(ctx, l.Name+" failed", "error", err)
		}
	}
	if l.Immediate && ctx.Err() == nil {
		run()
	}
	t := time.NewTicker(l.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			run()
		case <-l.Kick: // nil: never
			run()
		}
	}
}

// Stopping reports whether err is only the sign that ctx ended: ctx is done
// and err is (or wraps) context.Canceled or context.DeadlineExceeded. Such an
// error is the shutdown working, not a failure to log as one.
func Stopping(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ctx.Err()))
}
