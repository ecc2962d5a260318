package delivery

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// The Standard Webhooks slow-down answers (429, 502, 503, 504) are retried
// after the Retry-After they carry (clamped to twice the scheduled delay);
// any other failure's Retry-After is ignored and the schedule alone decides.
// None of them moves the subscription's failure count while retries are left.
func TestSlowDownAnswersHonourRetryAfterOthersIgnoreIt(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status  int
		honours bool
	}{
		{http.StatusTooManyRequests, true},
		{http.StatusBadGateway, true},
		{http.StatusServiceUnavailable, true},
		{http.StatusGatewayTimeout, true},
		{http.StatusInternalServerError, false},
	}
	for _, c := range cases {
		t.Run(strconv.Itoa(c.status), func(t *testing.T) {
			b := setup(t)
			var mu sync.Mutex
			var at []time.Time
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				mu.Lock()
				at = append(at, time.Now())
				n := len(at)
				mu.Unlock()
				if n == 1 {
					// An HTTP date for one status, seconds for the others: both forms count.
					if c.status == http.StatusGatewayTimeout {
						w.Header().Set("Retry-After", time.Now().Add(3*time.Second).UTC().Format(http.TimeFormat))
					} else {
						w.Header().Set("Retry-After", "2")
					}
					w.WriteHeader(c.status)
					return
				}
				w.WriteHeader(http.StatusNoContent)
			}))
			t.Cleanup(srv.Close)
			sub := b.createSub(t, srv.URL)
			// Scheduled delay 1s (0.8–1.2s with jitter); twice it is 2s, the clamp.
			b.runDeliverer(t, Config{RetrySchedule: []time.Duration{time.Second}})
			id := b.insert(t, sub.ID, "a", 1, `{}`)
			testkit.Eventually(t, waitLong, func() string { return testkit.Unless(len(b.attempts(t, id)) == 1, "the first attempt to be recorded") })
			if f := b.sub(t, sub.ID).ConsecutiveFailures; f != 0 {
				t.Fatalf("HTTP %d with a retry left moved consecutive_failures to %d", c.status, f)
			}
			r := b.waitStatus(t, id, store.StatusDelivered)
			if r.Attempts != 2 {
				t.Fatalf("delivered after %d attempts, want 2", r.Attempts)
			}
			mu.Lock()
			gap := at[1].Sub(at[0])
			mu.Unlock()
			if c.honours && gap < 1900*time.Millisecond {
				t.Fatalf("HTTP %d with Retry-After: retried after %s, want the Retry-After (clamped to 2s)", c.status, gap)
			}
			if !c.honours && gap >= 1500*time.Millisecond {
				t.Fatalf("HTTP %d: retried after %s; its Retry-After must be ignored (schedule 1s ±20%%)", c.status, gap)
			}
		})
	}
}

// A recovered window goes out oldest first, in asset_seq order per asset,
// with attempts reset; dead deliveries outside the window stay dead.
func TestRecoveredWindowIsDeliveredInAssetOrder(t *testing.T) {
	b := setup(t)
	ctx := t.Context()
	rc, sub := b.endpoint(t, nil)
	var ids []int64
	for i := range 3 {
		ids = append(ids, b.insert(t, sub.ID, "a", i+1, `{}`))
	}
	outside := b.insert(t, sub.ID, "b", 1, `{}`)
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.deliveries SET status = 'dead', dead_at = now(), attempts = 9,
  created_at = CASE WHEN id = $1 THEN now() - interval '2 hours' ELSE now() - interval '30 minutes' END
WHERE subscription_id = $2`, outside, sub.ID); err != nil {
		t.Fatal(err)
	}
	w, err := store.ParseWindow("1h", "", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.store.RecoverWindow(ctx, sub.ID, w)
	if err != nil || fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("recovered %v (%v), want %v oldest first", got, err, ids)
	}
	b.runDeliverer(t, Config{})
	for _, id := range ids {
		if r := b.waitStatus(t, id, store.StatusDelivered); r.Attempts != 1 {
			t.Fatalf("delivery %d delivered after %d attempts, want 1 (attempts reset)", id, r.Attempts)
		}
	}
	var seqs []int64
	for _, r := range rc.requests() {
		seqs = append(seqs, r.Env.AssetSeq)
	}
	if fmt.Sprint(seqs) != "[1 2 3]" {
		t.Fatalf("asset_seq order at the receiver %v, want [1 2 3]", seqs)
	}
	if st := b.get(t, outside).Status; st != store.StatusDead {
		t.Fatalf("delivery outside the window is %s, want dead", st)
	}
}
