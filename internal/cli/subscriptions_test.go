package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/outboxbridge/bridge/internal/keyring/keyringtest"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

// webhookCLIEnv points the commands at a fresh database and returns it with
// t's context. Tests that use it are not parallel: they set the process
// environment the commands read.
func webhookCLIEnv(t *testing.T) (*pgtest.DB, context.Context) {
	t.Helper()
	db := pgtest.New(t)
	t.Setenv("DATABASE_URL", db.URL)
	t.Setenv("WEBHOOK_ALLOW_HTTP", "")
	t.Setenv("BRIDGE_SECRET_KEYS", keyringtest.Keys)
	return db, t.Context()
}

func runBridge(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Execute(args, &out, &errb)
	return code, out.String(), errb.String()
}

func mustRunBridge(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errOut := runBridge(t, args...)
	if code != ExitOK {
		t.Fatalf("bridge %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
	}
	return out
}

func TestSubscriptionsCLIBadInputsExitTwo(t *testing.T) {
	webhookCLIEnv(t)
	const unknown = "6f1c2a9e-52c4-4c55-9d39-8f0c2d6c2f11"
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"bad url", []string{"subscriptions", "create", "--url", "not a url", "--event-types", "*"}, "url"},
		{"relative url", []string{"subscriptions", "create", "--url", "/hooks", "--event-types", "*"}, "url"},
		{"http without allow", []string{"subscriptions", "create", "--url", "http://x.example/", "--event-types", "*"}, "WEBHOOK_ALLOW_HTTP"},
		{"missing url", []string{"subscriptions", "create", "--event-types", "*"}, "--url is required"},
		{"missing event types", []string{"subscriptions", "create", "--url", "https://x.example/"}, "--event-types is required"},
		{"empty event types", []string{"subscriptions", "create", "--url", "https://x.example/", "--event-types", ""}, "event-types must list at least one"},
		{"blank event type", []string{"subscriptions", "create", "--url", "https://x.example/", "--event-types", "a,,b"}, "event-types"},
		{"bad wildcard", []string{"subscriptions", "create", "--url", "https://x.example/", "--event-types", "*.created"}, "event-types"},
		{"control character", []string{"subscriptions", "create", "--url", "https://x.example/", "--event-types", "order\x1b[31m.created"}, "must not contain control characters"},
		{"bad -o", []string{"subscriptions", "list", "-o", "yaml"}, "--output must be table or json"},
		{"url too long", []string{"subscriptions", "create", "--url", "https://x.example/" + strings.Repeat("a", 10000), "--event-types", "*"}, "at most 2048"},
		{"url port out of range", []string{"subscriptions", "create", "--url", "https://x.example:99999/", "--event-types", "*"}, "port 99999"},
		{"url with a space", []string{"subscriptions", "create", "--url", "https://x.example/a b", "--event-types", "*"}, "spaces"},
		{"reason too long", []string{"subscriptions", "disable", unknown, "--reason", strings.Repeat("r", 100000)}, "at most 1024"},
		{"bad -o on create", []string{"subscriptions", "create", "--url", "https://x.example/", "--event-types", "*", "-o", "xml"}, "--output"},
		{"unknown id show", []string{"subscriptions", "show", unknown}, "not found"},
		{"unknown id enable", []string{"subscriptions", "enable", unknown}, "not found"},
		{"unknown id delete", []string{"subscriptions", "delete", unknown}, "not found"},
		{"unknown id rotate", []string{"subscriptions", "rotate-secret", unknown}, "not found"},
		{"not a uuid", []string{"subscriptions", "disable", "42"}, "is not a UUID"},
		{"update nothing", []string{"subscriptions", "update", unknown}, "nothing to update"},
		{"negative rate limit", []string{"subscriptions", "create", "--url", "https://x.example/", "--event-types", "*", "--rate-limit", "-1"}, "--rate-limit"},
		{"rate limit not a number", []string{"subscriptions", "create", "--url", "https://x.example/", "--event-types", "*", "--rate-limit", "fast"}, "--rate-limit"},
		{"zero burst", []string{"subscriptions", "create", "--url", "https://x.example/", "--event-types", "*", "--rate-limit", "5", "--rate-burst", "0"}, "--rate-burst"},
		{"burst alone on update", []string{"subscriptions", "update", unknown, "--rate-burst", "5"}, "--rate-burst"},
		{"metadata address", []string{"subscriptions", "create", "--url", "https://169.254.169.254/latest", "--event-types", "*"}, "169.254.169.254, in 169.254.0.0/16 (link-local, cloud metadata)"},
		{"loopback", []string{"subscriptions", "create", "--url", "https://127.0.0.1:8443/", "--event-types", "*"}, "127.0.0.1, in 127.0.0.0/8 (loopback)"},
		{"ipv6 loopback", []string{"subscriptions", "create", "--url", "https://[::1]/", "--event-types", "*"}, "::1, in ::1/128 (loopback)"},
		{"hex loopback", []string{"subscriptions", "create", "--url", "https://0x7f000001/", "--event-types", "*"}, "127.0.0.1, in 127.0.0.0/8"},
		{"decimal loopback", []string{"subscriptions", "create", "--url", "https://2130706433/", "--event-types", "*"}, "127.0.0.1, in 127.0.0.0/8"},
		{"short loopback", []string{"subscriptions", "create", "--url", "https://127.1/", "--event-types", "*"}, "127.0.0.1, in 127.0.0.0/8"},
		{"mapped loopback", []string{"subscriptions", "create", "--url", "https://[::ffff:127.0.0.1]/", "--event-types", "*"}, "IPv4-mapped"},
		{"private on update", []string{"subscriptions", "update", unknown, "--url", "https://10.0.0.5/"}, "10.0.0.5, in 10.0.0.0/8 (private, RFC 1918)"},
		{"missing id", []string{"subscriptions", "show"}, "accepts 1 arg"},
		{"revive nothing", []string{"deliveries", "revive"}, "give delivery ids"},
		{"revive sub without --dead", []string{"deliveries", "revive", "--subscription", unknown}, "--dead"},
		{"revive bad id", []string{"deliveries", "revive", "x1"}, "not a positive integer"},
		{"revive unknown id", []string{"deliveries", "revive", "999999"}, "not found"},
		{"revive unknown subscription", []string{"deliveries", "revive", "--subscription", unknown, "--dead"}, "not found"},
		{"list bad status", []string{"deliveries", "list", "--status", "lost"}, "status"},
		{"list bad cursor", []string{"deliveries", "list", "--cursor", "abc"}, "cursor"},
		{"list bad limit", []string{"deliveries", "list", "--limit", "0"}, "limit"},
		{"attempts unknown", []string{"deliveries", "attempts", "999999"}, "not found"},
		{"show unknown", []string{"deliveries", "show", "999999"}, "not found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runBridge(t, c.args...)
			if code != ExitUsage {
				t.Fatalf("exit %d (stdout %q, stderr %q), want %d", code, out, errOut, ExitUsage)
			}
			if !strings.Contains(errOut, c.want) {
				t.Errorf("stderr %q does not say %q", errOut, c.want)
			}
		})
	}
}

func TestSubscriptionsCLILifecycle(t *testing.T) {
	webhookCLIEnv(t)
	var created struct {
		ID         string   `json:"id"`
		Secret     string   `json:"secret"`
		EventTypes []string `json:"event_types"`
		Topic      string   `json:"topic"`
	}
	out := mustRunBridge(t, "subscriptions", "create", "--url", "https://crm.example.com/hooks", "--event-types", "asset.*, order.paid",
		"--topic", "assets", "--description", "CRM", "-o", "json")
	if err := json.Unmarshal([]byte(out), &created); err != nil {
		t.Fatalf("create -o json: %v\n%s", err, out)
	}
	if !strings.HasPrefix(created.Secret, "whsec_") || len(created.EventTypes) != 2 || created.EventTypes[1] != "order.paid" || created.Topic != "assets" {
		t.Fatalf("created %+v", created)
	}
	// The secret is shown once: never by list or show.
	for _, args := range [][]string{{"subscriptions", "list"}, {"subscriptions", "list", "-o", "json"},
		{"subscriptions", "show", created.ID}, {"subscriptions", "show", created.ID, "-o", "json"}} {
		if out := mustRunBridge(t, args...); strings.Contains(out, created.Secret) || !strings.Contains(out, created.ID) {
			t.Errorf("bridge %s: secret shown or subscription missing:\n%s", strings.Join(args, " "), out)
		}
	}
	out = mustRunBridge(t, "subscriptions", "update", created.ID, "--event-types", "*", "--topic", "")
	if !strings.Contains(out, "event types  *") && !strings.Contains(out, "*") {
		t.Errorf("update output:\n%s", out)
	}
	var rotated struct {
		Secret  string `json:"secret"`
		Secrets []struct {
			ExpiresAt *string `json:"expires_at"`
		} `json:"secrets"`
	}
	out = mustRunBridge(t, "subscriptions", "rotate-secret", created.ID, "-o", "json")
	if err := json.Unmarshal([]byte(out), &rotated); err != nil {
		t.Fatal(err)
	}
	if rotated.Secret == created.Secret || !strings.HasPrefix(rotated.Secret, "whsec_") || len(rotated.Secrets) != 2 || rotated.Secrets[0].ExpiresAt == nil {
		t.Fatalf("rotate-secret: %s", out)
	}
	if out := mustRunBridge(t, "subscriptions", "disable", created.ID, "--reason", "migration"); !strings.Contains(out, "disabled: migration") {
		t.Errorf("disable output:\n%s", out)
	}
	if out := mustRunBridge(t, "subscriptions", "enable", created.ID, "-o", "json"); !strings.Contains(out, `"enabled": true`) {
		t.Errorf("enable output:\n%s", out)
	}
	if out := mustRunBridge(t, "subscriptions", "delete", created.ID, "-o", "json"); !strings.Contains(out, `"deleted": true`) {
		t.Errorf("delete output:\n%s", out)
	}
	if out := mustRunBridge(t, "subscriptions", "list", "-o", "json"); strings.Join(strings.Fields(out), "") != `{"items":[]}` {
		t.Errorf("list after delete: %s", out)
	}
}

// WEBHOOK_ALLOWED_CIDRS, the dialer's exemptions, admit a literal address
// at create time too (the demo and the tests' loopback receivers); a host
// name is not resolved at create time (the dialer checks it).
func TestSubscriptionsCLIAcceptsAllowedLiteralAddress(t *testing.T) {
	webhookCLIEnv(t)
	t.Setenv("WEBHOOK_ALLOW_HTTP", "true")
	t.Setenv("WEBHOOK_ALLOWED_CIDRS", "127.0.0.0/8")
	mustRunBridge(t, "subscriptions", "create", "--url", "http://127.0.0.1:9/hook", "--event-types", "*")
	mustRunBridge(t, "subscriptions", "create", "--url", "http://localhost:9/hook", "--event-types", "*")
	if code, _, errOut := runBridge(t, "subscriptions", "create", "--url", "http://[::1]:9/hook", "--event-types", "*"); code != ExitUsage || !strings.Contains(errOut, "::1") {
		t.Errorf("[::1] outside WEBHOOK_ALLOWED_CIDRS: exit %d, stderr %q", code, errOut)
	}
}
