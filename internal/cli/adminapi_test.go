package cli

import (
	"context"
	"net/http"
	"testing"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/keyring/keyringtest"
	"github.com/outboxbridge/bridge/internal/logging"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

// The admin API is on HTTP_ADDR of a long-running command exactly when
// ADMIN_TOKEN is set; health and metrics are there either way.
func TestRuntimeMountsAdminAPIOnlyWithToken(t *testing.T) {
	db := pgtest.NewParallel(t)
	for _, tc := range []struct {
		token string
		want  map[string]int // path → status with "Bearer <token>"
	}{
		{"", map[string]int{"/healthz": 200, "/metrics": 200, "/api/v1/outbox/stats": 404, "/openapi.json": 404}},
		{"admin-token-1", map[string]int{"/healthz": 200, "/metrics": 200, "/api/v1/outbox/stats": 200, "/api/v1/subscriptions": 200, "/openapi.json": 200}},
	} {
		env := map[string]string{"DATABASE_URL": db.URL, "HTTP_ADDR": "127.0.0.1:0", "BRIDGE_SECRET_KEYS": keyringtest.Keys}
		if tc.token != "" {
			env["ADMIN_TOKEN"] = tc.token
		}
		cfg, err := config.Load(env, config.Needs{Database: true})
		if err != nil {
			t.Fatal(err)
		}
		rt, err := startRuntimeWith(context.Background(), cfg, serviceDeliver, deliverStage.uses, runtimeOptions{
			getenv:    func(string) string { return "" },
			logger:    logging.New(t.Output(), "info", "text"),
			noGlobals: true,
		})
		if err != nil {
			t.Fatalf("startRuntime: %v", err)
		}
		base := "http://" + rt.Ops.Addr()
		get := func(path, auth string) int {
			req, _ := http.NewRequest("GET", base+path, nil)
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		for path, want := range tc.want {
			if got := get(path, "Bearer "+tc.token); got != want {
				t.Errorf("ADMIN_TOKEN=%q: GET %s = %d, want %d", tc.token, path, got, want)
			}
		}
		if tc.token != "" {
			if got := get("/api/v1/outbox/stats", "Bearer wrong"); got != http.StatusUnauthorized {
				t.Errorf("wrong token: %d, want 401", got)
			}
		}
		rt.Close()
	}
}
