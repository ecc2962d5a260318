package delivery

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// jitter spreads a delay by ±20% so the deliveries that failed together
// during an outage do not all come back in the same second.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// retryDelay is the wait before the next attempt: the scheduled delay
// (jittered), or the endpoint's Retry-After when it asks for longer — but
// never more than twice the scheduled delay, so one endpoint cannot park a
// delivery (and the stream behind it) for as long as it likes.
func retryDelay(scheduled, jittered time.Duration, retryAfter time.Duration, hasRetryAfter bool) time.Duration {
	d := jittered
	if hasRetryAfter && retryAfter > d {
		d = min(retryAfter, 2*scheduled)
	}
	return max(d, 0)
}

// slowDown reports whether status is one of the Standard Webhooks "slow
// down" answers: 429 Too Many Requests, 502 Bad Gateway, 503 Service
// Unavailable, 504 Gateway Timeout. They say the endpoint (or the proxy in
// front of it) is overloaded, not that the event is bad, so they are retried
// later and their Retry-After is honoured. They never bring a death sooner
// than the schedule would: the wait before the next attempt is at least the
// scheduled delay (a short Retry-After cannot make the attempts run out
// faster), and the attempt budget is the schedule's.
func slowDown(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// parseRetryAfter reads a Retry-After header (delay-seconds or an HTTP date)
// of a slow-down answer (slowDown); other statuses' Retry-After is ignored —
// a 500 that says "come back in a day" must not park its stream that long.
func parseRetryAfter(status int, h http.Header, now time.Time) (time.Duration, bool) {
	if !slowDown(status) {
		return 0, false
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return time.Duration(min(secs, int64(365*24*3600))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
