package delivery

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// timedReceiver records every request's event, asset, sequence and the
// times it began and ended; it answers 500 until healthy is set.
type timedReceiver struct {
	*httptest.Server
	healthy atomic.Bool
	mu      sync.Mutex
	reqs    []timedRequest
}

type timedRequest struct {
	id, asset  string
	seq        int64
	began, end time.Time
	ok         bool
}

func newTimedReceiver(t *testing.T) *timedReceiver {
	t.Helper()
	rc := &timedReceiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		body, _ := io.ReadAll(r.Body)
		var env struct {
			ID       string  `json:"id"`
			AssetID  *string `json:"asset_id"`
			AssetSeq int64   `json:"asset_seq"`
		}
		_ = json.Unmarshal(body, &env)
		ok := rc.healthy.Load()
		code := http.StatusInternalServerError
		if ok {
			code = http.StatusNoContent
		}
		w.WriteHeader(code)
		req := timedRequest{id: env.ID, seq: env.AssetSeq, began: began, end: time.Now(), ok: ok}
		if env.AssetID != nil {
			req.asset = *env.AssetID
		}
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, req)
		rc.mu.Unlock()
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *timedReceiver) requests() []timedRequest {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]timedRequest(nil), rc.reqs...)
}

// An endpoint that fails every stream is probed one head at a time, at most
// once per ProbeInterval, instead of every due head being sent again at
// once; waiting behind a probe charges nothing; the first 2xx releases
// every waiting head, and each stream is then delivered in order, its
// attempts those its endpoint saw. A healthy subscription beside it is
// delivered meanwhile.
func TestBreakerProbesAnEndpointThatFailsEveryStream(t *testing.T) {
	b := setup(t)
	const streams, perStream = 30, 2
	const interval = 200 * time.Millisecond
	failing := newTimedReceiver(t)
	sub := b.createSub(t, failing.URL)
	healthy := newTimedReceiver(t)
	healthy.healthy.Store(true)
	other := b.createSub(t, healthy.URL)
	var ids, others []int64
	for a := range streams {
		for n := 1; n <= perStream; n++ {
			ids = append(ids, b.insert(t, sub.ID, fmt.Sprintf("a%02d", a), n, `{}`))
			others = append(others, b.insert(t, other.ID, fmt.Sprintf("a%02d", a), n, `{}`))
		}
	}
	// One request of a subscription at a time, so the requests come in a
	// known order: a head each of 5 streams (a failed head waits 3 s), and
	// the breaker opens. Without it the 25 heads not tried yet would go out
	// back to back.
	const after = 5
	b.runDeliverer(t, Config{RetrySchedule: []time.Duration{3 * time.Second, 3 * time.Second}, MaxInFlightPerSubscription: 1,
		BreakerAfter: after, ProbeInterval: interval})

	const probes = 5
	testkit.Eventually(t, waitLong, func() string {
		return testkit.Unless(len(failing.requests()) >= after+probes, "%d failures and %d probes (have %d requests)", after, probes, len(failing.requests()))
	})
	reqs := failing.requests()
	first := map[string]bool{}
	for _, r := range reqs[:after] {
		first[r.asset] = true
		if r.seq != 1 {
			t.Fatalf("sent %s #%d: only heads go out", r.asset, r.seq)
		}
	}
	if len(first) != after {
		t.Fatalf("the first %d requests reached %d streams, want %d", after, len(first), after)
	}
	// From the breaker's opening on, one probe per interval at most: the
	// other heads, due since they were queued, wait.
	for i := after; i < len(reqs); i++ {
		if gap := reqs[i].began.Sub(reqs[i-1].began); gap < interval*3/4 {
			t.Fatalf("requests %d and %d of the failing endpoint %v apart while its breaker is open, want about ProbeInterval (%v)",
				i, i+1, gap, interval)
		}
	}
	// The healthy subscription flowed meanwhile.
	for _, id := range others {
		b.waitStatus(t, id, store.StatusDelivered)
	}
	// Nothing died, nothing counted towards disabling.
	var dead int
	if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM bridge.deliveries WHERE subscription_id = $1 AND status = 'dead'`, sub.ID).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if s := b.sub(t, sub.ID); dead != 0 || s.ConsecutiveFailures != 0 || !s.Enabled {
		t.Fatalf("while probing: %d dead, consecutive_failures %d, enabled %v; want none dead and 0", dead, s.ConsecutiveFailures, s.Enabled)
	}

	failing.healthy.Store(true)
	for _, id := range ids {
		b.waitStatus(t, id, store.StatusDelivered)
	}
	// Order per stream: no event acknowledged before its predecessor.
	acked := map[string]int64{}
	sent := map[string]int{}
	for _, r := range failing.requests() {
		sent[r.id]++
		if !r.ok {
			continue
		}
		if r.seq != acked[r.asset]+1 {
			t.Fatalf("stream %s: #%d acknowledged after #%d", r.asset, r.seq, acked[r.asset])
		}
		acked[r.asset] = r.seq
	}
	// Waiting behind a probe is no attempt: each delivery's attempts are the
	// requests its endpoint saw, and so is its attempt log.
	for _, id := range ids {
		d := b.get(t, id)
		if d.Attempts != sent[d.EventID] || len(b.attempts(t, id)) != d.Attempts {
			t.Fatalf("delivery %d: attempts %d, requests seen %d, attempt log %d; want all equal",
				id, d.Attempts, sent[d.EventID], len(b.attempts(t, id)))
		}
	}
	if s := b.sub(t, sub.ID); s.ConsecutiveFailures != 0 {
		t.Fatalf("consecutive_failures = %d after the recovery", s.ConsecutiveFailures)
	}
}

// A few failing streams do not open the breaker: one stream's payload that
// its endpoint rejects is retried on its schedule while the endpoint's other
// streams are delivered.
func TestBreakerStaysClosedForFewerFailingStreamsThanBreakerAfter(t *testing.T) {
	b := setup(t)
	var calls sync.Map
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var env struct {
			AssetID *string `json:"asset_id"`
		}
		_ = json.Unmarshal(body, &env)
		if env.AssetID != nil && len(*env.AssetID) > 0 && (*env.AssetID)[0] == 'x' {
			n, _ := calls.LoadOrStore(*env.AssetID, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	sub := b.createSub(t, srv.URL)
	b.runDeliverer(t, Config{RetrySchedule: []time.Duration{0, 0, 0}, BreakerAfter: 5, ProbeInterval: time.Hour})
	var bad []int64
	for i := range 4 {
		bad = append(bad, b.insert(t, sub.ID, fmt.Sprintf("x%d", i), 1, `{}`))
	}
	// Each bad head runs through its whole schedule at once (no probe
	// interval of an hour held it): dead after 4 attempts.
	for _, id := range bad {
		if r := b.waitStatus(t, id, store.StatusDead); r.Attempts != 4 {
			t.Fatalf("dead after %d attempts, want 4", r.Attempts)
		}
	}
	good := b.insert(t, sub.ID, "good", 1, `{}`)
	b.waitStatus(t, good, store.StatusDelivered)
}

// An endpoint that refuses each event's first attempt and accepts the next
// is not failing every stream: a wave of first attempts fails on more than
// BreakerAfter streams in a row, but the endpoint accepted a delivery within
// ProbeInterval, so the breaker stays closed and every stream is delivered
// at its schedule (here at once), not one probe per ProbeInterval (an hour).
func TestBreakerStaysClosedForAnEndpointThatAcceptsSomeAttempts(t *testing.T) {
	b := setup(t)
	const streams = 20
	var (
		mu      sync.Mutex
		seen    = map[string]int{}
		refused int
		wave    = make(chan struct{}) // closed once every stream's first attempt arrived
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var env struct {
			ID      string  `json:"id"`
			AssetID *string `json:"asset_id"`
		}
		_ = json.Unmarshal(body, &env)
		mu.Lock()
		seen[env.ID]++
		first := seen[env.ID] == 1 && env.AssetID != nil && *env.AssetID != "warm"
		if first {
			if refused++; refused == streams {
				close(wave)
			}
		}
		mu.Unlock()
		if !first {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		// The wave's refusals answer together, so they are failures in a
		// row with no 2xx between them.
		select {
		case <-wave:
		case <-time.After(waitLong):
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	sub := b.createSub(t, srv.URL)
	b.runDeliverer(t, Config{RetrySchedule: []time.Duration{0, 0, 0}, MaxInFlightPerSubscription: 2 * streams,
		BreakerAfter: 5, ProbeInterval: time.Hour})
	warm := b.insert(t, sub.ID, "warm", 1, `{}`)
	b.waitStatus(t, warm, store.StatusDelivered)
	var ids []int64
	for a := range streams {
		ids = append(ids, b.insert(t, sub.ID, fmt.Sprintf("a%02d", a), 1, `{}`))
	}
	for _, id := range ids {
		if d := b.waitStatus(t, id, store.StatusDelivered); d.Attempts != 2 {
			t.Fatalf("delivery %d: delivered after %d attempts, want 2 (refused once, then accepted)", id, d.Attempts)
		}
	}
}
