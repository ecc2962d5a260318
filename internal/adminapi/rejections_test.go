package adminapi

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

type countingMetrics struct{ n atomic.Int64 }

func (c *countingMetrics) AuthFailure() { c.n.Add(1) }

// A rejected request is counted every time and logged at most once per
// source per second, the line saying how many were rejected since the
// source's previous line; the right token is neither.
func TestRejectedRequestsLoggedPerSourceAndCounted(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	m := &countingMetrics{}
	a := newAPI(Config{Token: testToken, Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Metrics: m})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a.rejections.now = func() time.Time { return now }
	send := func(remote, auth string) int {
		req := httptest.NewRequest(http.MethodGet, "/api/v1/outbox/stats", nil)
		req.RemoteAddr = remote
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		a.ServeHTTP(rec, req)
		return rec.Code
	}
	for range 5 {
		if code := send("192.0.2.7:4000", "Bearer wrong"); code != http.StatusUnauthorized {
			t.Fatalf("wrong token: %d", code)
		}
	}
	send("198.51.100.9:5000", "")
	now = now.Add(time.Second)
	send("192.0.2.7:4001", "Bearer wrong") // another port, same source

	type line struct {
		Msg      string `json:"msg"`
		Source   string `json:"source"`
		Reason   string `json:"reason"`
		Rejected int    `json:"rejected"`
		Path     string `json:"path"`
	}
	var got []line
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var x line
		if err := json.Unmarshal([]byte(l), &x); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if x.Msg == "admin API request rejected" {
			got = append(got, x)
		}
	}
	want := []line{
		{"admin API request rejected", "192.0.2.7", "wrong bearer token", 1, "/api/v1/outbox/stats"},
		{"admin API request rejected", "198.51.100.9", "no Authorization header", 1, "/api/v1/outbox/stats"},
		{"admin API request rejected", "192.0.2.7", "wrong bearer token", 5, "/api/v1/outbox/stats"},
	}
	if len(got) != len(want) {
		t.Fatalf("rejection lines %+v, want %+v\n%s", got, want, logs.String())
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if n := m.n.Load(); n != 7 {
		t.Errorf("counted %d rejections, want 7", n)
	}
	if strings.Contains(logs.String(), "wrong\"") || strings.Contains(logs.String(), testToken) {
		t.Errorf("a token reached the log:\n%s", logs.String())
	}
}

// Authorizes is the API's own check, for what else shows more to the
// admin (/readyz details); a blank token authorizes nobody.
func TestAuthorizes(t *testing.T) {
	t.Parallel()
	req := func(auth string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/readyz", nil)
		r.Header.Set("Authorization", auth)
		return r
	}
	ok := Authorizes(testToken)
	if !ok(req("Bearer "+testToken)) || !ok(req("bearer "+testToken)) {
		t.Error("the right token is refused")
	}
	for _, bad := range []string{"", "Bearer", "Bearer wrong", "Bearer " + testToken + "x", testToken} {
		if ok(req(bad)) {
			t.Errorf("Authorization %q authorized", bad)
		}
	}
	for _, blank := range []string{"", "  "} {
		if Authorizes(blank)(req("Bearer ")) || Authorizes(blank)(req("Bearer  ")) {
			t.Errorf("blank token %q authorizes", blank)
		}
	}
}
