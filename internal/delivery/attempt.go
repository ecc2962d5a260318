package delivery

import (
	"context"
	"net/http"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// AttemptResult is one HTTP attempt as a caller outside this package (the
// fast lane) sees it: the same request, signature, SSRF check and judgement
// as the slow lane's.
type AttemptResult struct {
	// Outcome is what the attempt log keeps (never the payload).
	Outcome store.Outcome
	// Success: a 2xx answer.
	Success bool
	// Gone: 410, which disables the subscription.
	Gone bool
	// Interrupted: no answer because ctx was cancelled (shutdown, a
	// partition revoked) — not the endpoint's failure, so not charged.
	Interrupted bool
	retryAfter  time.Duration
	hasRA       bool
}

// Attempt sends c once through client (NewHTTPClient), continuing the trace
// stored with it, and judges the answer.
func Attempt(ctx context.Context, client *http.Client, c *store.Claim, timeout time.Duration) AttemptResult {
	res := send(ctx, client, c, timeout, time.Now())
	return AttemptResult{
		Outcome: store.Outcome{
			StartedAt: res.started, Duration: res.duration, StatusCode: res.status, Error: res.describe(),
			ResponseBody: truncateUTF8(res.body, maxResponseStored), TraceID: res.traceID,
		},
		Success:     res.success(),
		Gone:        res.status == http.StatusGone,
		Interrupted: !res.success() && res.status == 0 && ctx.Err() != nil,
		retryAfter:  res.retryAfter,
		hasRA:       res.hasRA,
	}
}

// RetryIn is how long a delivery whose attempt number attempts (1-based)
// failed with r waits before the next one: the schedule's entry, jittered,
// or the endpoint's Retry-After clamped as the slow lane clamps it. 0 with
// no entry left: the schedule is exhausted.
func RetryIn(schedule []time.Duration, attempts int, r AttemptResult) time.Duration {
	if attempts < 1 || attempts > len(schedule) {
		return 0
	}
	scheduled := schedule[attempts-1]
	return retryDelay(scheduled, jitter(scheduled), r.retryAfter, r.hasRA)
}
