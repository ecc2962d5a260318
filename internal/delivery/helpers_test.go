package delivery

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

type testBundle struct {
	db    *pgtest.DB
	pool  *pgxpool.Pool
	subs  *store.SubscriptionStore
	store *store.DeliveryStore
}

// setup is a test's opening: the stores over a database of the test's own
// (pgtest.New). It marks the test parallel: no two tests share a database, so
// none can see another's deliveries. A test that measures the process itself
// (the heap) opens with setupAlone.
func setup(t *testing.T) *testBundle {
	t.Helper()
	t.Parallel()
	return setupAlone(t)
}

func setupAlone(t *testing.T) *testBundle {
	t.Helper()
	db := pgtest.New(t)
	return &testBundle{
		db:    db,
		pool:  db.Pool,
		subs:  store.NewSubscriptionStore(db.Pool, true, time.Hour),
		store: store.NewDeliveryStore(db.Pool),
	}
}

var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

func ptr[T any](v T) *T { return &v }

func (b *testBundle) createSub(t *testing.T, url string) *store.Subscription {
	t.Helper()
	sub, err := b.subs.Create(context.Background(), store.SubscriptionInput{URL: &url, EventTypes: []string{"*"}})
	if err != nil {
		t.Fatalf("create subscription: %v", err)
	}
	return sub
}

// insert queues a delivery the way the consumer does (store.Enqueue, one
// event fanned out to subID) and returns its id. asset "" means the null
// asset.
func (b *testBundle) insert(t testing.TB, subID, asset string, n int, payload string) int64 {
	t.Helper()
	ev := store.Event{
		ID:          fmt.Sprintf("evt-%s-%s-%d-%d", subID[:8], asset, n, time.Now().UnixNano()),
		Type:        "asset.updated",
		Topic:       "assets",
		AssetSeq:    ptr(int64(n)),
		Payload:     payload,
		CreatedAt:   time.Now(),
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
	if asset != "" {
		ev.AssetID = &asset
	}
	var f store.Fanout
	f.Deliver(f.AddEvent(ev), subID)
	ctx := context.Background()
	if err := store.Enqueue(ctx, b.pool, &f); err != nil {
		t.Fatalf("enqueue delivery: %v", err)
	}
	var id int64
	err := b.pool.QueryRow(ctx, `SELECT id FROM bridge.deliveries WHERE subscription_id = $1 AND event_id = $2`, subID, ev.ID).Scan(&id)
	if err != nil {
		t.Fatalf("read back delivery %s: %v", ev.ID, err)
	}
	return id
}

// get reads a delivery as the log shows it (store.DeliveryStore.Get).
func (b *testBundle) get(t *testing.T, id int64) *store.Delivery {
	t.Helper()
	d, err := b.store.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("read delivery %d: %v", id, err)
	}
	return d
}

func (b *testBundle) sub(t *testing.T, id string) *store.Subscription {
	t.Helper()
	s, err := b.subs.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("get subscription: %v", err)
	}
	return s
}

// received is one request as the receiver saw it.
type received struct {
	Header http.Header
	Body   []byte
	Env    struct {
		ID       string          `json:"id"`
		Type     string          `json:"type"`
		AssetID  *string         `json:"asset_id"`
		AssetSeq int64           `json:"asset_seq"`
		Data     json.RawMessage `json:"data"`
	}
}

// receiver is an httptest endpoint that records requests and answers with
// what respond returns (200 when nil).
type receiver struct {
	*httptest.Server
	mu      sync.Mutex
	got     []received
	respond func(r *received, n int) int
}

func newReceiver(t *testing.T, respond func(r *received, n int) int) *receiver {
	t.Helper()
	rc := &receiver{respond: respond}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec := received{Header: r.Header.Clone(), Body: body}
		_ = json.Unmarshal(body, &rec.Env)
		rc.mu.Lock()
		rc.got = append(rc.got, rec)
		n := len(rc.got)
		rc.mu.Unlock()
		code := http.StatusOK
		if rc.respond != nil {
			code = rc.respond(&rec, n)
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

// endpoint is a receiver answering with respond (200 when nil) and a
// subscription to its URL.
func (b *testBundle) endpoint(t *testing.T, respond func(r *received, n int) int) (*receiver, *store.Subscription) {
	t.Helper()
	rc := newReceiver(t, respond)
	return rc, b.createSub(t, rc.URL)
}

// runDeliverer starts a Deliverer and stops it when the test ends; stop
// cancels it and waits for Run to return.
func (b *testBundle) runDeliverer(t *testing.T, cfg Config) (d *Deliverer, stop func() error) {
	t.Helper()
	if cfg.AllowedCIDRs == nil {
		cfg.AllowedCIDRs = loopback
	}
	cfg.PollInterval = cmpOr(cfg.PollInterval, 50*time.Millisecond)
	d, err := NewDeliverer(b.pool, cfg)
	if err != nil {
		t.Fatalf("new deliverer: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(30 * time.Second):
				runErr = fmt.Errorf("Run did not return 30s after cancel")
			}
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("deliverer: %v", err)
		}
	})
	return d, stop
}

func cmpOr[T comparable](a, b T) T {
	var zero T
	if a != zero {
		return a
	}
	return b
}

// newRedirector answers every request with a 302 to target.
func newRedirector(t *testing.T, target string) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.RedirectHandler(target, http.StatusFound))
	t.Cleanup(s.Close)
	return s
}

// countingMetrics is a Metrics hook that counts what it is told.
type countingMetrics struct {
	mu       sync.Mutex
	outcomes map[string]int
	disabled int
}

func (m *countingMetrics) Attempt(_ int, _ time.Duration, outcome string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.outcomes == nil {
		m.outcomes = map[string]int{}
	}
	m.outcomes[outcome]++
}

func (m *countingMetrics) SubscriptionDisabled() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.disabled++
}

func (m *countingMetrics) snapshot() (map[string]int, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for k, v := range m.outcomes {
		out[k] = v
	}
	return out, m.disabled
}

// newRawReceiver answers every request with write.
func newRawReceiver(t *testing.T, write func(http.ResponseWriter)) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		write(w)
	}))
	t.Cleanup(s.Close)
	return s
}

func claimOnce(t *testing.T, b *testBundle, by string, limit int) []store.Claim {
	t.Helper()
	cs, err := b.store.Claim(context.Background(), store.ClaimParams{ClaimedBy: by, Limit: limit, MaxInFlight: 100, Lease: time.Minute})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return cs
}
