package service

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is a capped exponential delay with jitter: attempt 1 waits about
// Base, each further attempt twice as long, never more than Max (before
// jitter). Zero fields take the defaults given.
type Backoff struct {
	// Base is the first delay. Default 100ms.
	Base time.Duration
	// Max caps the delay before jitter. Default 5s.
	Max time.Duration
	// Jitter spreads each delay by ±Jitter·delay, so replicas that failed
	// together (one broker outage) do not retry in lockstep. Default 0.2;
	// negative: none.
	Jitter float64
}

func (b Backoff) withDefaults() Backoff {
	if b.Base <= 0 {
		b.Base = 100 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 5 * time.Second
	}
	b.Max = max(b.Max, b.Base)
	switch {
	case b.Jitter == 0:
		b.Jitter = 0.2
	case b.Jitter < 0:
		b.Jitter = 0
	}
	return b
}

// Delay returns the delay before retry number attempt (1-based; attempt < 1
// counts as 1).
func (b Backoff) Delay(attempt int) time.Duration {
	b = b.withDefaults()
	d := b.Base
	for i := 1; i < attempt && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if b.Jitter > 0 {
		d += time.Duration((rand.Float64()*2 - 1) * b.Jitter * float64(d))
	}
	return max(d, 0)
}

// Sleep waits d or until ctx ends; it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
