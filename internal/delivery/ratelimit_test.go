package delivery

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// arrivals are the times requests to path arrived, in order.
func (o *overlapReceiver) arrivals(path string) []time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := append([]time.Time(nil), o.at[path]...)
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// TestRateLimitHoldsAcrossTwoReplicas: two deliverers, each with its own
// pool, drain a backlog of a subscription limited to 40/s (burst 5) and of
// an unlimited one. Together they never send the limited one more than
// limit + burst in any second, they do send it close to its limit (the
// deliverers wake when a token is due: their poll tick is a second, which
// alone would give ~burst a second), the unlimited one is not slowed, and
// waiting for tokens costs no attempt. Order per stream stays exact.
func TestRateLimitHoldsAcrossTwoReplicas(t *testing.T) {
	b := setup(t)
	rc := &overlapReceiver{at: map[string][]time.Time{}, busySub: map[string]int{}, peakSub: map[string]int{},
		busyStream: map[string]int{}, last: map[string]int64{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	const rate, burst, assets, perAsset = 40, 5, 24, 10
	limited, err := b.subs.Create(context.Background(), store.SubscriptionInput{URL: ptr(srv.URL + "/limited"), EventTypes: []string{"*"},
		RateLimit: ptr(rate), RateBurst: ptr(burst)})
	if err != nil {
		t.Fatal(err)
	}
	free := b.createSub(t, srv.URL+"/free")
	for n := 1; n <= perAsset; n++ {
		for a := range assets {
			b.insert(t, limited.ID, fmt.Sprintf("asset-%d", a), n, `{}`)
			b.insert(t, free.ID, fmt.Sprintf("asset-%d", a), n, `{}`)
		}
	}
	const want = assets * perAsset
	// Each replica logs every delivery at debug level (with its
	// deliverer_id): the test checks that both sent to the limited
	// subscription, so the limit held across them, not within one.
	logs := make([]*testkit.LogBuffer, 2)
	for r := range 2 {
		logs[r] = &testkit.LogBuffer{}
		pool, err := pgxpool.New(context.Background(), b.db.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		rb := *b
		rb.pool = pool
		rb.runDeliverer(t, Config{ID: fmt.Sprintf("replica-%d", r+1), Workers: 16, ClaimLoops: 2, PollInterval: time.Second,
			Logger: slog.New(slog.NewJSONHandler(logs[r], &slog.HandlerOptions{Level: slog.LevelDebug}))})
	}
	testkit.Eventually(t, 2*time.Minute, func() string {
		var n int
		_ = b.pool.QueryRow(context.Background(), `SELECT count(*) FROM bridge.deliveries WHERE status = 'delivered'`).Scan(&n)
		return testkit.Unless(n == 2*want, "%d of %d delivered", n, 2*want)
	})

	got, fast := rc.arrivals("/limited"), rc.arrivals("/free")
	if len(got) != want || len(fast) != want {
		t.Fatalf("receiver got %d limited and %d unlimited requests; want %d each (no duplicates)", len(got), len(fast), want)
	}
	rc.mu.Lock()
	if rc.overlaps != 0 || rc.disorder != 0 {
		t.Errorf("%d requests overlapped another of their stream, %d arrived out of stream order", rc.overlaps, rc.disorder)
	}
	rc.mu.Unlock()
	// A replica logs "delivered" once the outcome is committed, so the
	// last line can follow the row the wait above saw: wait for all of
	// them (exactly want: one more would be a second send), then check
	// that both replicas took part.
	sent := make([]int, len(logs))
	testkit.Eventually(t, 10*time.Second, func() string {
		for r, l := range logs {
			sent[r] = 0
			for line := range strings.SplitSeq(l.String(), "\n") {
				if strings.Contains(line, `"msg":"delivered"`) && strings.Contains(line, limited.ID) {
					sent[r]++
				}
			}
		}
		return testkit.Unless(sent[0]+sent[1] == want, "replicas logged %v deliveries of the limited subscription's %d", sent, want)
	})
	if sent[0] < want/10 || sent[1] < want/10 {
		t.Errorf("replicas sent %v of the limited subscription's %d; want both to take part", sent, want)
	}
	// Every window of one second starting at an arrival.
	peak := 0
	for i := range got {
		j := sort.Search(len(got), func(j int) bool { return !got[j].Before(got[i].Add(time.Second)) })
		peak = max(peak, j-i)
	}
	// The bucket is kept in the claims' clock (their transaction's now());
	// the receiver sees each request later, and not all equally late: the
	// first ones open connections and share the workers with the unlimited
	// backlog, so the first second's requests arrive bunched. 150 ms of
	// that spread is allowed (6 requests at 40/s): under -race on a busy
	// machine the first second held up to 49 (strict bound 45, seen in 3
	// of 7 runs; later windows stayed within it). Without the limit in the
	// claim the peak is the whole backlog.
	const jitter = rate * 15 / 100
	if peak > rate+burst+jitter {
		t.Errorf("%d limited requests within one second; the limit allows %d (%d/s + burst %d, + %d for the receiver's clock)",
			peak, rate+burst+jitter, rate, burst, jitter)
	}
	span := got[len(got)-1].Sub(got[0]).Seconds()
	// The bucket starts full: burst requests at once, then rate a second.
	achieved := float64(len(got)-burst) / span
	if achieved > rate*1.05 {
		t.Errorf("limited subscription got %.1f requests/s over %.2fs; limit %d/s", achieved, span, rate)
	}
	if achieved < rate*0.6 {
		t.Errorf("limited subscription got only %.1f requests/s over %.2fs; limit %d/s (starved?)", achieved, span, rate)
	}
	fastSpan := fast[len(fast)-1].Sub(fast[0]).Seconds()
	if fastSpan > span/2 {
		t.Errorf("unlimited subscription took %.2fs for its backlog, the limited one %.2fs: it was slowed", fastSpan, span)
	}
	// Waiting for tokens is not an attempt.
	var attempts, logged int
	if err := b.pool.QueryRow(context.Background(), `
SELECT (SELECT count(*) FROM bridge.deliveries WHERE attempts <> 1),
       (SELECT count(*) FROM bridge.delivery_attempts)`).Scan(&attempts, &logged); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 || logged != 2*want {
		t.Errorf("%d deliveries with attempts ≠ 1, %d attempt rows; want 0 and %d", attempts, logged, 2*want)
	}
	t.Logf("limited: %d requests in %.2fs (%.1f/s after the burst, peak %d in 1s, allowed %d + %d; by replica %v); unlimited: %.2fs",
		len(got), span, achieved, peak, rate+burst, jitter, sent, fastSpan)
}
