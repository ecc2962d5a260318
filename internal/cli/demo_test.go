package cli

import (
	"bytes"
	"strings"
	"testing"
)

func TestDemoRefusesBadFlagsWithUsageExit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"demo", "--events", "5"}, "--events must be at least 20"},
		{[]string{"demo", "--events", "100", "--assets", "30"}, "--assets must be at most"},
		{[]string{"demo", "--rate", "0"}, "--rate must be positive"},
		{[]string{"demo", "--timeout", "0s"}, "--timeout must be positive"},
		{[]string{"demo", "-o", "yaml"}, "--output must be table or json"},
	} {
		var stdout, stderr bytes.Buffer
		if code := Execute(c.args, &stdout, &stderr); code != ExitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", c.args, code, ExitUsage, stderr.String())
		}
		if !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: stderr %q, want it to say %q", c.args, stderr.String(), c.want)
		}
	}
}

func TestDemoEnvKeepsUserSettingsAndForcesItsOwn(t *testing.T) {
	t.Parallel()
	env := demoEnv(map[string]string{
		"RELAY_POLL_INTERVAL":   "2s",
		"WEBHOOK_ALLOWED_CIDRS": "10.0.0.0/8",
		"CONSUMER_TOPICS":       "assets",
		"WEBHOOK_ALLOW_HTTP":    "false",
	}, "demo.assets.x", "bridge-demo-x")
	for k, want := range map[string]string{
		"DATABASE_URL":            "postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable",
		"RELAY_POLL_INTERVAL":     "2s", // the user's
		"WEBHOOK_POLL_INTERVAL":   "100ms",
		"RELAY_MAX_MESSAGE_BYTES": "65536",
		"CONSUMER_TOPICS":         "demo.assets.x", // the run's, whatever was set
		"CONSUMER_GROUP":          "bridge-demo-x",
		"WEBHOOK_ALLOW_HTTP":      "true",
		"WEBHOOK_ALLOWED_CIDRS":   "10.0.0.0/8,127.0.0.0/8",
	} {
		if env[k] != want {
			t.Errorf("%s = %q, want %q", k, env[k], want)
		}
	}
}
