package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxbridge/bridge/internal/metrics/metricstest"
	"github.com/outboxbridge/bridge/internal/outboxstore"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/progress"
	"github.com/outboxbridge/bridge/outbox"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newMetrics(t *testing.T, every time.Duration) *Metrics {
	t.Helper()
	m, err := New(Options{RefreshInterval: every})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown(context.Background()) })
	return m
}

// scrapeObserved scrapes a fresh Metrics (refreshed every millisecond) once
// observe has registered its gauges, and unregisters them after.
func scrapeObserved(t *testing.T, observe func(*Metrics) (func() error, error)) metricstest.Families {
	t.Helper()
	m := newMetrics(t, time.Millisecond)
	unregister, err := observe(m)
	if err != nil {
		t.Fatal(err)
	}
	defer unregister() //nolint:errcheck
	return metricstest.Scrape(t, m.Handler())
}

func want(t *testing.T, f metricstest.Families, name string, labels map[string]string, v float64) {
	t.Helper()
	got, ok := f.Value(name, labels)
	if !ok {
		t.Errorf("%s%v: missing", name, labels)
		return
	}
	if got != v {
		t.Errorf("%s%v = %v, want %v", name, labels, got, v)
	}
}

func TestRelayHooks(t *testing.T) {
	t.Parallel()
	m := newMetrics(t, 0)
	r := m.Relay()
	r.Produced("assets", 20*time.Millisecond)
	r.Produced("assets", 3*time.Second)
	r.Produced("orders", time.Millisecond)
	r.AttemptCharged("assets")
	r.Parked("assets", "poison")
	r.Parked("assets", "exhausted")
	r.Parked("assets", "exhausted")
	r.Outage(true)

	f := metricstest.Scrape(t, m.Handler())
	want(t, f, "bridge_relay_produced_total", map[string]string{"topic": "assets"}, 2)
	want(t, f, "bridge_relay_produced_total", map[string]string{"topic": "orders"}, 1)
	want(t, f, "bridge_relay_produce_latency_seconds", map[string]string{"topic": "assets"}, 2) // sample count
	want(t, f, "bridge_relay_attempts_charged_total", map[string]string{"topic": "assets"}, 1)
	want(t, f, "bridge_relay_parked_total", map[string]string{"topic": "assets", "reason": "poison"}, 1)
	want(t, f, "bridge_relay_parked_total", map[string]string{"topic": "assets", "reason": "exhausted"}, 2)
	want(t, f, "bridge_relay_outage", nil, 1)
	// The latency histogram's sum is in seconds.
	for _, mm := range f["bridge_relay_produce_latency_seconds"].GetMetric() {
		if mm.GetLabel()[0].GetValue() == "assets" {
			if s := mm.GetHistogram().GetSampleSum(); s < 3.01 || s > 3.03 {
				t.Errorf("latency sum = %v s, want 3.02", s)
			}
		}
	}
	// Process and Go runtime series come along.
	if !f.Has("process_resident_memory_bytes") || !f.Has("go_goroutines") {
		t.Error("process/runtime collectors missing")
	}

	r.Outage(false)
	want(t, metricstest.Scrape(t, m.Handler()), "bridge_relay_outage", nil, 0)
}

func TestDeliveryHooks(t *testing.T) {
	t.Parallel()
	m := newMetrics(t, 0)
	d := m.Deliveries()
	d.Attempt(200, 30*time.Millisecond, OutcomeDelivered)
	d.Attempt(503, time.Second, OutcomeRetry)
	d.Attempt(0, 15*time.Second, OutcomeRetry)
	d.Attempt(410, 10*time.Millisecond, OutcomeDead)
	d.SubscriptionDisabled()
	f := metricstest.Scrape(t, m.Handler())
	want(t, f, "bridge_delivery_attempts_total", map[string]string{"outcome": "delivered", "status_class": "2xx"}, 1)
	want(t, f, "bridge_delivery_attempts_total", map[string]string{"outcome": "retry", "status_class": "5xx"}, 1)
	want(t, f, "bridge_delivery_attempts_total", map[string]string{"outcome": "retry", "status_class": "none"}, 1)
	want(t, f, "bridge_delivery_attempts_total", map[string]string{"outcome": "dead", "status_class": "4xx"}, 1)
	want(t, f, "bridge_delivery_attempt_duration_seconds", map[string]string{"outcome": "retry"}, 2)
	want(t, f, "bridge_subscriptions_disabled_total", nil, 1)
}

func TestStatusClass(t *testing.T) {
	t.Parallel()
	for code, class := range map[int]string{0: "none", 99: "none", 200: "2xx", 204: "2xx", 301: "3xx", 410: "4xx", 429: "4xx", 503: "5xx", 600: "none"} {
		if got := StatusClass(code); got != class {
			t.Errorf("StatusClass(%d) = %q, want %q", code, got, class)
		}
	}
}

// Many concurrent scrapes within one refresh interval cost one read; a read
// after the interval refreshes; a failed read keeps the last good value and
// is counted.
func TestGaugeCacheNoQueryStorm(t *testing.T) {
	t.Parallel()
	m := newMetrics(t, time.Hour)
	var reads atomic.Int64
	unregister, err := m.observeOutbox(func(context.Context) (outboxstore.Stats, error) {
		n := reads.Add(1)
		time.Sleep(20 * time.Millisecond) // a slow query: concurrent scrapes pile up behind it
		return outboxstore.Stats{ByStatus: map[string]int64{"NEW": n}, OldestNewAgeSeconds: float64(n)}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unregister() //nolint:errcheck

	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() { metricstest.Scrape(t, m.Handler()) })
	}
	wg.Wait()
	if n := reads.Load(); n != 1 {
		t.Fatalf("20 concurrent scrapes made %d reads, want 1", n)
	}
	f := metricstest.Scrape(t, m.Handler())
	want(t, f, "bridge_outbox_rows", map[string]string{"status": "NEW"}, 1)
	want(t, f, "bridge_outbox_oldest_new_age_seconds", nil, 1)
	if n := reads.Load(); n != 1 {
		t.Fatalf("a later scrape within the interval read again (%d reads)", n)
	}
}

func TestGaugeCacheRefreshAndStaleOnError(t *testing.T) {
	t.Parallel()
	var reads atomic.Int64
	var fail atomic.Bool
	var errs []string
	now := time.Unix(1000, 0)
	c := newCached("test", 10*time.Second, func(context.Context) (int64, error) {
		n := reads.Add(1)
		if fail.Load() {
			return 0, errors.New("down")
		}
		return n, nil
	}, func(source string, err error) { errs = append(errs, source+": "+err.Error()) })
	c.now = func() time.Time { return now }

	if v, ok := c.get(context.Background()); !ok || v != 1 {
		t.Fatalf("first get = %d %v", v, ok)
	}
	now = now.Add(9 * time.Second)
	if v, _ := c.get(context.Background()); v != 1 || reads.Load() != 1 {
		t.Fatalf("within the interval: value %d after %d reads, want the cached 1 after 1 read", v, reads.Load())
	}
	now = now.Add(time.Second)
	if v, _ := c.get(context.Background()); v != 2 {
		t.Fatalf("after the interval: %d, want a fresh 2", v)
	}
	fail.Store(true)
	now = now.Add(10 * time.Second)
	if v, ok := c.get(context.Background()); !ok || v != 2 {
		t.Fatalf("failed read: %d %v, want the last good 2", v, ok)
	}
	if len(errs) != 1 || errs[0] != "test: down" {
		t.Fatalf("errors reported: %v", errs)
	}
	// A failing source is retried after the interval, not at every scrape.
	c.get(context.Background())
	if reads.Load() != 3 {
		t.Fatalf("a failing source was re-read within the interval (%d reads)", reads.Load())
	}
}

func TestRefreshErrorsCounted(t *testing.T) {
	t.Parallel()
	m := newMetrics(t, time.Hour)
	unregister, err := m.observeOutbox(func(context.Context) (outboxstore.Stats, error) {
		return outboxstore.Stats{}, errors.New("database down")
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unregister() //nolint:errcheck
	f := metricstest.Scrape(t, m.Handler())
	if f.Has("bridge_outbox_rows") {
		t.Error("a gauge never read successfully was exported")
	}
	want(t, metricstest.Scrape(t, m.Handler()), "bridge_metrics_refresh_errors_total", map[string]string{"source": "outbox"}, 1)
}

// The outbox gauges read the real table through outboxstore.ReadStats.
func TestOutboxGaugesFromDatabase(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 3 {
		id, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: "assets", AssetID: "a1", EventType: "asset.created", Payload: json.RawMessage(`{"n":` + string(rune('0'+i)) + `}`)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id.String())
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Age the rows, park one.
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.outbox SET created_at = now() - interval '90 seconds'`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.outbox SET status = 'FAILED', failed_at = now() WHERE id = $1`, ids[2]); err != nil {
		t.Fatal(err)
	}

	f := scrapeObserved(t, func(m *Metrics) (func() error, error) { return m.ObserveOutbox(db.Pool) })
	want(t, f, "bridge_outbox_rows", map[string]string{"status": "NEW"}, 2)
	want(t, f, "bridge_outbox_rows", map[string]string{"status": "FAILED"}, 1)
	want(t, f, "bridge_outbox_rows", map[string]string{"status": "SENT"}, 0)
	want(t, f, "bridge_outbox_failed_rows", map[string]string{"topic": "assets"}, 1)
	if age, _ := f.Value("bridge_outbox_oldest_new_age_seconds", nil); age < 90 || age > 150 {
		t.Errorf("oldest NEW age = %v s, want about 90", age)
	}
}

// The delivery gauges read bridge.deliveries and bridge.subscriptions.
func TestDeliveryGaugesFromDatabase(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	var subA, subB, subOff string
	for _, p := range []struct {
		id      *string
		enabled bool
	}{{&subA, true}, {&subB, true}, {&subOff, false}} {
		err := db.Pool.QueryRow(ctx, `INSERT INTO bridge.subscriptions (url, event_types, enabled) VALUES ('https://example.com/h', '{*}', $1) RETURNING id::text`, p.enabled).Scan(p.id)
		if err != nil {
			t.Fatal(err)
		}
	}
	ins := func(sub, status string, age time.Duration) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, payload, event_created_at, status, created_at)
VALUES ($1, gen_random_uuid()::text, 'asset.created', 'assets', 'a1', '{}', now(), $2, now() - make_interval(secs => $3))`,
			sub, status, age.Seconds())
		if err != nil {
			t.Fatal(err)
		}
	}
	ins(subA, "delivered", time.Hour)
	ins(subA, "pending", 120*time.Second)
	ins(subA, "pending", 10*time.Second)
	ins(subA, "delivering", 60*time.Second)
	ins(subA, "dead", 2*time.Hour)
	ins(subB, "delivered", time.Minute)

	f := scrapeObserved(t, func(m *Metrics) (func() error, error) { return m.ObserveDeliveries(db.Pool) })
	want(t, f, "bridge_deliveries", map[string]string{"status": "pending"}, 2)
	want(t, f, "bridge_deliveries", map[string]string{"status": "delivering"}, 1)
	want(t, f, "bridge_deliveries", map[string]string{"status": "delivered"}, 2)
	want(t, f, "bridge_deliveries", map[string]string{"status": "dead"}, 1)
	want(t, f, "bridge_subscriptions", map[string]string{"state": "enabled"}, 2)
	want(t, f, "bridge_subscriptions", map[string]string{"state": "disabled"}, 1)
	if age, _ := f.Value("bridge_delivery_oldest_pending_age_seconds", map[string]string{"subscription_id": subA}); age < 120 || age > 180 {
		t.Errorf("subscription A's oldest pending age = %v, want about 120", age)
	}
	want(t, f, "bridge_delivery_oldest_pending_age_seconds", map[string]string{"subscription_id": subB}, 0)
	if _, ok := f.Value("bridge_delivery_oldest_pending_age_seconds", map[string]string{"subscription_id": subOff}); ok {
		t.Error("a disabled subscription with nothing open is exported")
	}
}

// bridge_admin_auth_failures_total is exported at zero before the first
// rejection (an increase() alert sees the first one) and counts each.
func TestAdminAuthFailures(t *testing.T) {
	t.Parallel()
	m := newMetrics(t, 0)
	want(t, metricstest.Scrape(t, m.Handler()), "bridge_admin_auth_failures_total", nil, 0)
	m.Admin().AuthFailure()
	m.Admin().AuthFailure()
	want(t, metricstest.Scrape(t, m.Handler()), "bridge_admin_auth_failures_total", nil, 2)
}

// Every documented series a stage exports without a per-topic, -partition
// or -subscription label exists at 0 as soon as the stage starts, before
// its first event: a series created by its first event is an increase()
// an alert never sees. The relay's per-topic counters start at 0 the first
// time the relay reports anything for the topic. Histograms have no zero
// form and are left out. The list comes from docs/observability.md.
func TestDocumentedSeriesStartAtZero(t *testing.T) {
	db := pgtest.NewParallel(t)
	m := newMetrics(t, time.Hour)
	m.Relay()
	m.Deliveries()
	for _, observe := range []func() (func() error, error){
		func() (func() error, error) {
			return m.observeOutbox(func(context.Context) (outboxstore.Stats, error) {
				return outboxstore.Stats{ByStatus: map[string]int64{"NEW": 0, "SENT": 0, "FAILED": 0}}, nil
			})
		},
		func() (func() error, error) { return m.ObserveDeliveries(db.Pool) },
		func() (func() error, error) { return m.ObserveConsumer(&fakeConsumer{}, "g") },
		func() (func() error, error) { return m.ObserveFastLane(&fakeLane{}, "g") },
		func() (func() error, error) {
			return m.ObserveStall(&progress.Watch{Stage: "consume", Count: func() int64 { return 0 },
				Waiting: func(context.Context) (string, error) { return "", nil }})
		},
	} {
		unregister, err := observe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unregister() })
	}
	f := metricstest.Scrape(t, m.Handler())

	doc, err := os.ReadFile("../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(bridge_[a-z_]+)` \\| (counter|gauge|histogram) \\|([^|]*)\\|")
	checked := 0
	for _, r := range row.FindAllStringSubmatch(string(doc), -1) {
		name, typ, labels := r[1], r[2], r[3]
		if typ == "histogram" || regexp.MustCompile("`(topic|partition|subscription_id|group)`").MatchString(labels) {
			continue
		}
		checked++
		if !f.Has(name) {
			t.Errorf("%s (%s, labels %q) is documented but not exported before its first event", name, typ, strings.TrimSpace(labels))
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d documented series; the table's format changed?", checked)
	}
	want(t, f, "bridge_delivery_attempts_total", map[string]string{"outcome": "dead", "status_class": "5xx"}, 0)
	want(t, f, "bridge_delivery_attempts_total", map[string]string{"outcome": "dead", "status_class": "none"}, 0)
	want(t, f, "bridge_delivery_attempts_total", map[string]string{"outcome": "delivered", "status_class": "2xx"}, 0)
	want(t, f, "bridge_relay_outage", nil, 0)
	want(t, f, "bridge_metrics_refresh_errors_total", map[string]string{"source": "deliveries"}, 0)

	// A topic's counters appear at 0 with the first thing the relay says
	// about it, so its first parked row is an increase.
	m.Relay().Produced("assets", time.Millisecond)
	f = metricstest.Scrape(t, m.Handler())
	want(t, f, "bridge_relay_parked_total", map[string]string{"topic": "assets", "reason": "poison"}, 0)
	want(t, f, "bridge_relay_parked_total", map[string]string{"topic": "assets", "reason": "exhausted"}, 0)
	want(t, f, "bridge_relay_attempts_charged_total", map[string]string{"topic": "assets"}, 0)
	m.Relay().Parked("assets", "poison")
	want(t, metricstest.Scrape(t, m.Handler()), "bridge_relay_parked_total", map[string]string{"topic": "assets", "reason": "poison"}, 1)
}
