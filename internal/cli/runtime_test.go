package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/logging"
	"github.com/outboxbridge/bridge/internal/metrics/metricstest"
	"github.com/outboxbridge/bridge/internal/opsserver"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/relay"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/outbox"
)

func readyzOf(t *testing.T, base string) (int, opsserver.Readiness) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer resp.Body.Close()
	var r opsserver.Readiness
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("decode /readyz: %v", err)
	}
	return resp.StatusCode, r
}

// TestRuntimeOpsServerAndRelayMetrics runs `bridge relay`'s wiring for real
// (startRuntime, the ops server on a free port, the relay against an
// in-process broker) and checks what an operator would see: /metrics with
// plausible values, the oldest NEW row's age growing while the broker is
// down and back to 0 after, the outage gauge, and /readyz following Kafka.
func TestRuntimeOpsServerAndRelayMetrics(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	broker := kafkatest.Fake(t)
	brokerAddr := broker.ListenAddrs()[0]
	// The broker "stops" by dropping every request's connection (the way
	// the relay's own outage test does it). Closing the kfake cluster
	// instead leaves franz-go with refused connections, and then a produce
	// never calls back — reported to the relay's owner; not what this test
	// is about.
	var down atomic.Bool
	broker.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		broker.KeepControl()
		if down.Load() {
			return nil, errors.New("broker is down"), true
		}
		return nil, nil, false
	})

	cfg, err := config.Load(map[string]string{
		"DATABASE_URL":  db.URL,
		"KAFKA_BROKERS": brokerAddr,
		"HTTP_ADDR":     "127.0.0.1:0",
	}, config.Needs{Database: true, Kafka: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rt, err := startRuntimeWith(ctx, cfg, serviceRelay, relayStage.uses, runtimeOptions{
		getenv:    func(string) string { return "" },
		logger:    logging.New(t.Output(), "info", "text"),
		refresh:   100 * time.Millisecond,
		noGlobals: true,
	})
	if err != nil {
		t.Fatalf("startRuntime: %v", err)
	}
	defer rt.Close()
	if rt.Ops == nil {
		t.Fatal("no ops server with HTTP_ADDR set")
	}
	base := "http://" + rt.Ops.Addr()

	rc := relay.Config{
		Logger:         rt.Logger,
		TracerProvider: rt.TracerProvider,
		Metrics:        rt.RelayMetrics,
		PollInterval:   50 * time.Millisecond,
		BackoffBase:    50 * time.Millisecond,
		BackoffMax:     200 * time.Millisecond,
		ProduceTimeout: 2 * time.Second,
	}
	client, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokerAddr), kgo.DialTimeout(time.Second)}, relay.ProducerOptions(rc)...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.New(rt.Pool, client, rc).Run(ctx) }()
	defer func() {
		cancel()
		if err := <-relayDone; err != nil {
			t.Errorf("relay.Run: %v", err)
		}
	}()

	enqueue := func(n int) {
		t.Helper()
		tx, err := rt.Pool.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background()) //nolint:errcheck
		for i := range n {
			_, err := outbox.Enqueue(context.Background(), tx, outbox.Event{
				Topic: "assets", AssetID: fmt.Sprintf("a%d", i%2), EventType: "asset.created", Payload: json.RawMessage(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	scrape := func() metricstest.Families { return metricstest.ScrapeURL(t, base+"/metrics") }
	val := func(f metricstest.Families, name string, labels map[string]string) float64 {
		v, _ := f.Value(name, labels)
		return v
	}

	// /healthz and /readyz while all is well.
	resp, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/healthz = %d", resp.StatusCode)
	}
	if code, r := readyzOf(t, base); code != 200 {
		t.Fatalf("/readyz with everything up = %d %+v", code, r)
	}

	// A small run: 3 events relayed.
	enqueue(3)
	testkit.Eventually(t, 20*time.Second, func() string {
		f := scrape()
		produced := val(f, "bridge_relay_produced_total", map[string]string{"topic": "assets"})
		sent := val(f, "bridge_outbox_rows", map[string]string{"status": "SENT"})
		latency := val(f, "bridge_relay_produce_latency_seconds", map[string]string{"topic": "assets"})
		age, ok := f.Value("bridge_outbox_oldest_new_age_seconds", nil)
		if produced != 3 || sent != 3 || latency != 3 || !ok || age != 0 {
			return fmt.Sprintf("produced=%v sent=%v latency samples=%v oldest NEW age=%v (%v)", produced, sent, latency, age, ok)
		}
		return ""
	})
	if f := scrape(); val(f, "bridge_relay_outage", nil) != 0 {
		t.Errorf("outage gauge = %v with the broker up", val(f, "bridge_relay_outage", nil))
	}

	// The broker goes away: the new row waits, its age grows, the relay
	// reports an outage, /readyz says Kafka is unreachable.
	down.Store(true)
	enqueue(1)
	var firstAge float64
	testkit.Eventually(t, 20*time.Second, func() string {
		f := scrape()
		firstAge = val(f, "bridge_outbox_oldest_new_age_seconds", nil)
		if n := val(f, "bridge_outbox_rows", map[string]string{"status": "NEW"}); n != 1 || firstAge <= 0 {
			return fmt.Sprintf("NEW rows=%v oldest age=%v, want 1 row with a positive age", n, firstAge)
		}
		return ""
	})
	testkit.Eventually(t, 20*time.Second, func() string {
		if age := val(scrape(), "bridge_outbox_oldest_new_age_seconds", nil); age < firstAge+1 {
			return fmt.Sprintf("oldest NEW age %v, want it to grow past %v", age, firstAge+1)
		}
		return ""
	})
	// bridge_relay_outage is set by the relay when a produce fails and no
	// broker answers a ping. With every connection dropped, franz-go
	// v1.22.3 does not call the produce back (the record timeout is only
	// evaluated when a request is written), so the relay waits inside its
	// cycle until the broker returns and never reports the outage: logged
	// here, reported to the relay's owner, not asserted.
	t.Logf("bridge_relay_outage during the outage: %v", val(scrape(), "bridge_relay_outage", nil))
	testkit.Eventually(t, 10*time.Second, func() string {
		code, r := readyzOf(t, base)
		for _, c := range r.Checks {
			if c.Name == "kafka" && !c.OK && code == http.StatusServiceUnavailable {
				return ""
			}
		}
		return fmt.Sprintf("/readyz = %d %+v, want 503 with kafka failing", code, r)
	})

	// The broker is back on the same address: the row goes out, the age
	// falls to 0, the outage ends, the replica is ready again.
	down.Store(false)
	testkit.Eventually(t, 30*time.Second, func() string {
		f := scrape()
		produced := val(f, "bridge_relay_produced_total", map[string]string{"topic": "assets"})
		age, _ := f.Value("bridge_outbox_oldest_new_age_seconds", nil)
		outage := val(f, "bridge_relay_outage", nil)
		if produced != 4 || age != 0 || outage != 0 {
			return fmt.Sprintf("produced=%v oldest NEW age=%v outage=%v, want 4, 0, 0", produced, age, outage)
		}
		return ""
	})
	testkit.Eventually(t, 10*time.Second, func() string {
		if code, r := readyzOf(t, base); code != 200 {
			return fmt.Sprintf("/readyz = %d %+v after the broker came back", code, r)
		}
		return ""
	})
	f := scrape()
	if !f.Has("target_info") {
		t.Error("target_info (service.name, service.version) missing")
	}
	if v, ok := f.Value("target_info", map[string]string{"service_name": serviceRelay}); !ok || v != 1 {
		t.Errorf("target_info service_name = %s missing", serviceRelay)
	}
}

// An empty HTTP_ADDR runs no server; a bad OTEL_* variable stops the
// command with a configuration error naming it.
func TestRuntimeNoServerAndBadOTELConfig(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	cfg, err := config.Load(map[string]string{"DATABASE_URL": db.URL, "BRIDGE_ALLOW_PLAINTEXT_SECRETS": "true"}, config.Needs{Database: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg.HTTP.Addr = "" // the server is off
	cfg.HTTP.AdminToken = "an-admin-token-nobody-can-use"
	quiet := logging.Discard()
	var logs bytes.Buffer
	rt, err := startRuntimeWith(context.Background(), cfg, serviceDeliver, deliverStage.uses, runtimeOptions{
		getenv: func(string) string { return "" }, logger: slog.New(slog.NewTextHandler(&logs, nil)), noGlobals: true})
	if err != nil {
		t.Fatal(err)
	}
	if rt.Ops != nil {
		t.Error("ops server started with HTTP_ADDR empty")
	}
	// ADMIN_TOKEN without a server to serve the API on: said, not ignored.
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "ADMIN_TOKEN is set but HTTP_ADDR=off") {
		t.Errorf("no warning for ADMIN_TOKEN with HTTP_ADDR=off:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), cfg.HTTP.AdminToken) {
		t.Errorf("the log shows the admin token:\n%s", logs.String())
	}
	// The deliverer's gauges are registered even without a server.
	if f := metricstest.Scrape(t, rt.Metrics.Handler()); !f.Has("bridge_deliveries") || f.Has("bridge_outbox_rows") {
		t.Errorf("deliver runtime: bridge_deliveries present=%v, bridge_outbox_rows present=%v; want only the delivery gauges",
			f.Has("bridge_deliveries"), f.Has("bridge_outbox_rows"))
	}
	rt.Close()
	rt.Close() // twice is safe

	_, err = startRuntimeWith(context.Background(), cfg, serviceDeliver, deliverStage.uses, runtimeOptions{
		getenv: func(k string) string {
			if k == "OTEL_TRACES_SAMPLER" {
				return "sometimes"
			}
			return ""
		}, logger: quiet, noGlobals: true})
	var ce *config.Error
	if err == nil || !asConfigError(err, &ce) || ce.Var != "OTEL_TRACES_SAMPLER" {
		t.Fatalf("startRuntime with OTEL_TRACES_SAMPLER=sometimes = %v, want a config error", err)
	}
}

func asConfigError(err error, target **config.Error) bool { return errors.As(err, target) }

// TestGCPercentDefaultUnlessGOGCSet: the long-running commands collect at
// defaultGCPercent, and an operator's GOGC is left to the Go runtime.
func TestGCPercentDefaultUnlessGOGCSet(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	if _, set := applyGCPercent(func(k string) string {
		if k == "GOGC" {
			return "50"
		}
		return ""
	}); set {
		t.Error("GOGC=50: applyGCPercent set a percent of its own")
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC set: GC percent %d; want it left alone (100)", got)
	}
	if pct, set := applyGCPercent(func(string) string { return "" }); !set || pct != defaultGCPercent {
		t.Errorf("GOGC unset: applyGCPercent = %d, %v; want %d, true", pct, set, defaultGCPercent)
	}
	if got := debug.SetGCPercent(100); got != defaultGCPercent {
		t.Errorf("GOGC unset: GC percent %d; want %d", got, defaultGCPercent)
	}
}
