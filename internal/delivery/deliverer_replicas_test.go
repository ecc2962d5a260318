package delivery

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/testkit"
)

// overlapReceiver records, per subscription (URL path), the most requests it
// had at once, and counts requests that overlapped another of the same
// (subscription, asset) stream or arrived out of stream order. With at set
// it also records when each request arrived, per subscription.
type overlapReceiver struct {
	at         map[string][]time.Time
	mu         sync.Mutex
	busySub    map[string]int
	peakSub    map[string]int
	busyStream map[string]int
	last       map[string]int64
	overlaps   int
	disorder   int
	received   int
}

func (o *overlapReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	body, _ := io.ReadAll(r.Body)
	var env struct {
		AssetID  string `json:"asset_id"`
		AssetSeq int64  `json:"asset_seq"`
	}
	_ = json.Unmarshal(body, &env)
	stream := r.URL.Path + "|" + env.AssetID
	o.mu.Lock()
	if o.at != nil {
		o.at[r.URL.Path] = append(o.at[r.URL.Path], now)
	}
	o.busySub[r.URL.Path]++
	o.peakSub[r.URL.Path] = max(o.peakSub[r.URL.Path], o.busySub[r.URL.Path])
	o.busyStream[stream]++
	if o.busyStream[stream] > 1 {
		o.overlaps++
	}
	if env.AssetSeq != o.last[stream]+1 {
		o.disorder++
	}
	o.last[stream] = env.AssetSeq
	o.mu.Unlock()
	// Long enough that claims of several replicas overlap it.
	time.Sleep(10 * time.Millisecond)
	o.mu.Lock()
	o.busySub[r.URL.Path]--
	o.busyStream[stream]--
	o.received++
	o.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// TestInFlightCapExactAcrossThreeReplicas: three deliverers (each with two
// claim loops) against one database never have more than the
// per-subscription cap in flight to one subscription, nor two requests of
// one stream at once, as the receiver sees it.
func TestInFlightCapExactAcrossThreeReplicas(t *testing.T) {
	b := setup(t)
	rc := &overlapReceiver{busySub: map[string]int{}, peakSub: map[string]int{}, busyStream: map[string]int{}, last: map[string]int64{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	const cap, assets, perAsset = 3, 40, 3
	subs := []string{b.createSub(t, srv.URL+"/a").ID, b.createSub(t, srv.URL+"/b").ID}
	for n := 1; n <= perAsset; n++ {
		for _, s := range subs {
			for a := range assets {
				b.insert(t, s, fmt.Sprintf("asset-%d", a), n, `{}`)
			}
		}
	}
	for r := range 3 {
		b.runDeliverer(t, Config{ID: fmt.Sprintf("replica-%d", r+1), Workers: 16, MaxInFlightPerSubscription: cap,
			ClaimLoops: 2, PollInterval: 2 * time.Millisecond})
	}
	want := len(subs) * assets * perAsset
	testkit.Eventually(t, 2*time.Minute, func() string {
		var n int
		_ = b.pool.QueryRow(context.Background(), `SELECT count(*) FROM bridge.deliveries WHERE status = 'delivered'`).Scan(&n)
		return testkit.Unless(n == want, "every delivery to arrive")
	})
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for path, peak := range rc.peakSub {
		if peak > cap {
			t.Errorf("subscription %s had %d requests in flight at once, cap %d", path, peak, cap)
		}
	}
	if rc.overlaps != 0 || rc.disorder != 0 {
		t.Errorf("%d requests overlapped another of their stream, %d arrived out of stream order", rc.overlaps, rc.disorder)
	}
	if rc.received != want {
		t.Errorf("receiver got %d requests, want %d (no duplicates)", rc.received, want)
	}
	t.Logf("peak in flight per subscription: %v (cap %d)", rc.peakSub, cap)
}
