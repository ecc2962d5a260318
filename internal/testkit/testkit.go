// Package testkit holds what tests of every stage need, written once:
// Eventually (poll a condition instead of sleeping), Unavailable (a missing
// service fails under CI=true and skips elsewhere), LogBuffer (a log sink safe
// to read while goroutines write it) and DocumentedDefaults.
package testkit

import (
	"fmt"
	"os"
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
	deadline := time.Now().Add(timeout)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not true within %s: %s", timeout, msg)
		}
		time.Sleep(Poll)
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
