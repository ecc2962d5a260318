package opsserver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxbridge/bridge/internal/pgtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func start(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	s := New(cfg)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return s, "http://" + s.Addr()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func readyz(t *testing.T, base string) (int, Readiness) {
	t.Helper()
	code, body := get(t, base+"/readyz")
	var r Readiness
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("readyz body %q: %v", body, err)
	}
	return code, r
}

func TestHealthMetricsAndMountedHandlers(t *testing.T) {
	t.Parallel()
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "bridge_up 1\n") })
	s, base := start(t, Config{Metrics: metrics})
	// The admin API mounts on the same mux after the server started.
	s.Handle("GET /v1/ping", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "pong") }))

	if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, body := get(t, base+"/metrics"); code != 200 || body != "bridge_up 1\n" {
		t.Errorf("/metrics = %d %q", code, body)
	}
	if code, body := get(t, base+"/v1/ping"); code != 200 || body != "pong" {
		t.Errorf("/v1/ping = %d %q", code, body)
	}
	if code, _ := get(t, base+"/nope"); code != 404 {
		t.Errorf("/nope = %d", code)
	}
	resp, err := http.Post(base+"/healthz", "text/plain", strings.NewReader(""))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /healthz = %d", resp.StatusCode)
	}
	// No checks: ready whenever alive.
	if code, r := readyz(t, base); code != 200 || r.Status != "ready" {
		t.Errorf("/readyz without checks = %d %+v", code, r)
	}
}

func TestReadyzFailingCheck(t *testing.T) {
	t.Parallel()
	var kafkaDown atomic.Bool
	kafkaDown.Store(true)
	_, base := start(t, Config{
		CacheFor:    -1,
		ShowDetails: func(*http.Request) bool { return true },
		Checks: []Check{
			{Name: "postgres", Run: func(context.Context) error { return nil }},
			KafkaCheck(func(context.Context) error {
				if kafkaDown.Load() {
					return errors.New("dial tcp 127.0.0.1:9092: connection refused")
				}
				return nil
			}),
		},
	})
	code, r := readyz(t, base)
	if code != http.StatusServiceUnavailable || r.Status != "not ready" {
		t.Fatalf("/readyz = %d %+v, want 503", code, r)
	}
	if len(r.Checks) != 2 || !r.Checks[0].OK || r.Checks[1].OK || !strings.Contains(r.Checks[1].Error, "connection refused") {
		t.Errorf("checks = %+v", r.Checks)
	}
	kafkaDown.Store(false)
	if code, r := readyz(t, base); code != 200 {
		t.Errorf("/readyz after recovery = %d %+v", code, r)
	}
}

// Without the admin token /readyz says ready or not and which check fails,
// never the check's error text (it names the database user and database);
// with it, the text too. The cached result keeps its details for the next
// authorized caller.
func TestReadyzDetailsOnlyForAuthorized(t *testing.T) {
	t.Parallel()
	const detail = `failed to connect to user=bridge database=bridge: password authentication failed`
	_, base := start(t, Config{
		ShowDetails: func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer admin" },
		Checks: []Check{
			{Name: "postgres", Run: func(context.Context) error { return errors.New(detail) }},
			{Name: "kafka", Run: func(context.Context) error { return nil }},
		},
	})
	get := func(auth string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, base+"/readyz", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, auth := range []string{"", "Bearer wrong"} {
		code, body := get(auth)
		var r Readiness
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatal(err)
		}
		if code != 503 || r.Status != "not ready" || len(r.Checks) != 2 || r.Checks[0].Name != "postgres" || r.Checks[0].OK || !r.Checks[1].OK {
			t.Errorf("/readyz (auth %q) = %d %s", auth, code, body)
		}
		if strings.Contains(body, "password") || strings.Contains(body, "user=") || strings.Contains(body, `"error"`) {
			t.Errorf("/readyz (auth %q) shows the check's error: %s", auth, body)
		}
	}
	if code, body := get("Bearer admin"); code != 503 || !strings.Contains(body, detail) {
		t.Errorf("/readyz with the token = %d %s, want the error text", code, body)
	}
}

// A check that hangs is cut off at the check timeout: the probe answers 503
// in time instead of hanging with it.
func TestReadyzCheckTimeout(t *testing.T) {
	t.Parallel()
	_, base := start(t, Config{
		CheckTimeout: 100 * time.Millisecond,
		ShowDetails:  func(*http.Request) bool { return true },
		Checks: []Check{{Name: "slow", Run: func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		}}},
	})
	t0 := time.Now()
	code, r := readyz(t, base)
	if code != 503 || !strings.Contains(r.Checks[0].Error, "deadline") {
		t.Errorf("/readyz = %d %+v", code, r)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("/readyz took %s", d)
	}
}

// A flood of probes within CacheFor costs one round of checks.
func TestReadyzCached(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	_, base := start(t, Config{
		CacheFor: time.Hour,
		Checks:   []Check{{Name: "count", Run: func(context.Context) error { runs.Add(1); return nil }}},
	})
	for range 10 {
		readyz(t, base)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("10 probes ran the checks %d times, want 1", n)
	}
}

// The schema check against a real database: 503 while the schema is behind
// this binary (never migrated), 200 once it is current.
func TestReadyzSchema(t *testing.T) {
	t.Parallel()
	behind := pgtest.Empty(t)
	current := pgtest.New(t)
	for _, tc := range []struct {
		name string
		db   *pgtest.DB
		want int
	}{{"behind", behind, 503}, {"current", current, 200}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, base := start(t, Config{Checks: []Check{PostgresCheck(tc.db.Pool), SchemaCheck(tc.db.Pool)},
				ShowDetails: func(*http.Request) bool { return true }})
			code, r := readyz(t, base)
			if code != tc.want {
				t.Fatalf("/readyz = %d %+v, want %d", code, r, tc.want)
			}
			if tc.want == 503 && (r.Checks[1].Name != "schema" || !strings.Contains(r.Checks[1].Error, "bridge migrate")) {
				t.Errorf("schema check = %+v, want it to say to run bridge migrate", r.Checks[1])
			}
		})
	}
}

func TestStartBusyAddressFails(t *testing.T) {
	t.Parallel()
	s1, _ := start(t, Config{})
	s2 := New(Config{Addr: s1.Addr()})
	if err := s2.Start(); err == nil || !strings.Contains(err.Error(), "HTTP_ADDR") {
		t.Fatalf("Start on a busy address = %v, want an error naming HTTP_ADDR", err)
	}
	if err := s2.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown of a server that never started: %v", err)
	}
}
