// Package testkit holds what tests of every stage need, written once:
// Eventually (poll a condition instead of sleeping), Unavailable (a missing
// service fails under CI=true and skips elsewhere), Jaeger (where the test
// Jaeger is), LogBuffer (a log sink safe to read while goroutines write it)
// and DocumentedDefaults.
package testkit

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/config"
)

// Poll is how often Eventually re-checks its condition.
const Poll = 25 * time.Millisecond

// Eventually calls cond until it returns "" (the condition holds) or timeout
// passes; then it fails the test with cond's last complaint, so the failure
// says what state the test saw rather than only that it timed out.
func Eventually(t testing.TB, timeout time.Duration, cond func() string) {
	t.Helper()
	EventuallyEvery(context.Background(), t, timeout, Poll, cond)
}

// EventuallyEvery is Eventually re-checking every every (a condition that is
// costly to read, such as a browser page, is polled less often), and failing
// at once when ctx ends: what the condition reads has gone away, and waiting
// out the timeout would only hide why.
func EventuallyEvery(ctx context.Context, t testing.TB, timeout, every time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not true within %s: %s", timeout, msg)
		}
		select {
		case <-time.After(every):
		case <-ctx.Done():
			t.Fatalf("gave up waiting (%v): %s", ctx.Err(), msg)
		}
	}
}

// Unless is the cond for a plain boolean: "" when ok, else complaint. For
// Eventually(t, d, func() string { return testkit.Unless(n == 3, "want 3 rows, have %d", n) }).
func Unless(ok bool, format string, args ...any) string {
	if ok {
		return ""
	}
	return fmt.Sprintf(format, args...)
}

// Unavailable fails the test under CI=true (a missing service must never turn
// into a green run) and skips it otherwise, naming the service and how to
// start it.
func Unavailable(t testing.TB, service, how string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s is not reachable (%v); start it with %s", service, err, how)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg + " (skipping because CI is not true)")
}

// DocumentedDefaults fails the test for each default that a stage's config
// source file documents in a field comment but that differs from the
// environment variable's envDefault (the comment is what a reader trusts),
// and for each environment-backed field that the stage's withDefaults
// (applied: Config{}.withDefaults()) does not set to its envDefault (env:
// ConfigFromEnv of config.Defaults()).
func DocumentedDefaults[C any](t testing.TB, configFile string, applied, env C) {
	t.Helper()
	src, err := os.ReadFile(configFile)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := config.DocumentedDefaultMismatches(configFile, string(src))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range append(bad, config.DefaultsNotApplied(applied, env)...) {
		t.Error(b)
	}
}

// Jaeger returns the OTLP/HTTP address and the query URL of the test Jaeger
// (BRIDGE_TEST_JAEGER_OTLP, BRIDGE_TEST_JAEGER_QUERY; by default where
// scripts/services-up.sh starts Jaeger v2), failing the test under CI=true
// (skipping otherwise) when either does not answer.
func Jaeger(t testing.TB) (otlp, query string) {
	t.Helper()
	otlp = cmp.Or(os.Getenv("BRIDGE_TEST_JAEGER_OTLP"), "127.0.0.1:4318")
	query = strings.TrimRight(cmp.Or(os.Getenv("BRIDGE_TEST_JAEGER_QUERY"), "http://127.0.0.1:16686"), "/")
	how := "`make services` (scripts/services-up.sh)"
	conn, err := net.DialTimeout("tcp", otlp, 3*time.Second)
	if err != nil {
		Unavailable(t, "Jaeger OTLP/HTTP at "+otlp, how, err)
	}
	conn.Close()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(query + "/api/services")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET /api/services: %s", resp.Status)
		}
	}
	if err != nil {
		Unavailable(t, "Jaeger query at "+query, how, err)
	}
	return otlp, query
}
