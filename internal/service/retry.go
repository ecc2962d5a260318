package service

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxbridge/bridge/internal/logging"
)

// Wait configures Retry.
type Wait struct {
	// Name says what is retried, for logs and the final error ("connect to
	// PostgreSQL at 127.0.0.1:5432"). Required.
	Name string
	// Timeout: give up after this long and return the last error. 0: retry
	// until ctx ends.
	Timeout time.Duration
	// AttemptTimeout bounds one call of fn. 0: no bound beyond the others.
	AttemptTimeout time.Duration
	// Backoff between attempts. Zero value: 100ms doubling to 5s, ±20%.
	Backoff Backoff
	// LogEvery: each class of failure is logged at most once per this long,
	// with the number of failures since, so an outage of minutes is a few
	// lines, not thousands. Default 30s.
	LogEvery time.Duration
	// Permanent, when set, reports a failure retrying cannot cure: Retry
	// returns it at once.
	Permanent func(error) bool
	// Class names a failure's class. Default: its message.
	Class func(error) string
	// Logger receives the failure lines (warn) and the recovery (info).
	// Nil: discard.
	Logger *slog.Logger
}

// Retry calls fn until it returns nil, then returns nil. It gives up when
// w.Timeout passes (returning the last error) or ctx ends (returning an error
// that wraps ctx's).
func Retry(ctx context.Context, w Wait, fn func(context.Context) error) error {
	log := w.Logger
	if log == nil {
		log = logging.Discard()
	}
	class := w.Class
	if class == nil {
		class = func(err error) string { return err.Error() }
	}
	every := w.LogEvery
	if every <= 0 {
		every = 30 * time.Second
	}
	start := time.Now()
	var deadline time.Time
	if w.Timeout > 0 {
		deadline = start.Add(w.Timeout)
	}
	type seen struct {
		logged time.Time
		since  int // failures since the last line
	}
	classes := map[string]*seen{}
	for attempt := 1; ; attempt++ {
		err := func() error {
			actx, cancel := ctx, context.CancelFunc(func() {})
			if w.AttemptTimeout > 0 {
				actx, cancel = context.WithTimeout(ctx, w.AttemptTimeout)
			}
			defer cancel()
			return fn(actx)
		}()
		if err == nil {
			if attempt > 1 {
				log.InfoContext(ctx, w.Name+": succeeded after retrying", "attempts", attempt, "waited", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (last error: %v)", w.Name, ctx.Err(), err)
		}
		if w.Permanent != nil && w.Permanent(err) {
			return fmt.Errorf("%s: %w", w.Name, err)
		}
		now := time.Now()
		if !deadline.IsZero() && !now.Before(deadline) {
			return fmt.Errorf("%s: still failing after %s: %w", w.Name, w.Timeout, err)
		}
		c := class(err)
		s := classes[c]
		if s == nil {
			s = &seen{}
			classes[c] = s
		}
		s.since++
		if s.logged.IsZero() || now.Sub(s.logged) >= every {
			args := []any{"error", err, "failures", s.since, "waiting", now.Sub(start).Round(time.Millisecond)}
			if !deadline.IsZero() {
				args = append(args, "gives_up_in", deadline.Sub(now).Round(time.Second))
			}
			log.WarnContext(ctx, w.Name+" failed; retrying", args...)
			s.logged, s.since = now, 0
		}
		d := w.Backoff.Delay(attempt)
		if !deadline.IsZero() {
			d = min(d, time.Until(deadline))
		}
		if !Sleep(ctx, d) {
			return fmt.Errorf("%s: %w (last error: %v)", w.Name, ctx.Err(), err)
		}
	}
}
