package cli

import (
	"strings"
	"testing"
)

// Not parallel: it sets the process environment the command reads.
func TestDeliverRefusesBadWebhookSettingsWithExitTwo(t *testing.T) {
	for name, tc := range map[string]struct{ key, value, want string }{
		"bad cidr":         {"WEBHOOK_ALLOWED_CIDRS", "127.0.0.1/99", "WEBHOOK_ALLOWED_CIDRS"},
		"lease <= timeout": {"WEBHOOK_LEASE", "10s", "WEBHOOK_LEASE"},
		"no workers":       {"WEBHOOK_WORKERS", "0", "WEBHOOK_WORKERS"},
		"bad schedule":     {"WEBHOOK_RETRY_SCHEDULE", "5s,soon", "WEBHOOK_RETRY_SCHEDULE"},
	} {
		t.Run(name, func(t *testing.T) {
			// Nothing listens on port 1: reaching PostgreSQL would fail with
			// exit 1, so exit 2 proves the settings were checked first.
			t.Setenv("DATABASE_URL", "postgres://bridge:bridge@127.0.0.1:1/bridge?sslmode=disable")
			t.Setenv(tc.key, tc.value)
			code, _, stderr := runBridge(t, "deliver")
			if code != ExitUsage {
				t.Fatalf("exit %d (stderr %q), want %d", code, stderr, ExitUsage)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q does not name %s", stderr, tc.want)
			}
		})
	}
}
