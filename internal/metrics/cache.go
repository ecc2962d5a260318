package metrics

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// loadTimeout bounds one refresh: a scrape must never hang on a stuck query.
const loadTimeout = 5 * time.Second

// cached holds the last snapshot of one source and re-reads it at most once
// per interval. The mutex is held across the read on purpose: when a scrape
// arrives while another is reading, it waits for that read instead of
// starting its own, so N concurrent scrapes cost one query.
type cached[T any] struct {
	source string
	every  time.Duration
	load   func(context.Context) (T, error)
	onErr  func(source string, err error)

	mu    sync.Mutex
	val   T
	ok    bool      // val holds a successful read
	tried time.Time // last read attempt, successful or not
	now   func() time.Time
}

func newCached[T any](source string, every time.Duration, load func(context.Context) (T, error), onErr func(string, error)) *cached[T] {
	return &cached[T]{source: source, every: every, load: load, onErr: onErr, now: time.Now}
}

// get returns the snapshot, re-reading it first when it is older than the
// interval. A failed read keeps the previous snapshot (and is retried after
// the interval, not at the next scrape: a database that is down must not be
// hammered by every scrape either). ok is false until a read succeeded.
func (c *cached[T]) get(ctx context.Context) (T, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tried.IsZero() || c.now().Sub(c.tried) >= c.every {
		c.tried = c.now()
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), loadTimeout)
		v, err := c.load(lctx)
		cancel()
		if err != nil {
			c.onErr(c.source, err)
		} else {
			c.val, c.ok = v, true
		}
	}
	return c.val, c.ok
}

// zeroRefreshErrors exports the source's refresh-error count at 0 when its
// gauges are registered, so the first failed read is an increase.
func (m *Metrics) zeroRefreshErrors(source string) {
	m.refreshErrors.Add(context.Background(), 0, metric.WithAttributes(attribute.String("source", source)))
}

// onRefreshError counts and logs a failed gauge read.
func (m *Metrics) onRefreshError(source string, err error) {
	m.refreshErrors.Add(context.Background(), 1, metric.WithAttributes(attribute.String("source", source)))
	m.log.Warn("metrics: refresh failed; serving the last value", "source", source, "error", err)
}
