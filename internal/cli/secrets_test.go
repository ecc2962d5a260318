package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/keyring"
	"github.com/outboxbridge/bridge/internal/keyring/keyringtest"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

// test1Only is keyringtest.Keys' older key alone (the ring before rotation).
var test1Only = strings.Split(keyringtest.Keys, ",")[1]

func storedSecrets(t *testing.T, db *pgtest.DB) []string {
	t.Helper()
	return pgtest.Column[string](t, db.Pool, `SELECT secret FROM bridge.subscription_secrets ORDER BY id`)
}

// The commands that write a secret refuse to without a key ring (exit 2,
// before connecting), plain text only when allowed explicitly; rotate-key
// seals the plain-text secrets and those under older keys, reporting what
// it did, and has nothing left to do when run again.
func TestSecretsCLIRotateKey(t *testing.T) {
	db, _ := webhookCLIEnv(t)
	create := func(url string) string {
		t.Helper()
		var sub struct{ ID, Secret string }
		if err := json.Unmarshal([]byte(mustRunBridge(t, "subscriptions", "create", "--url", url, "--event-types", "*", "-o", "json")), &sub); err != nil {
			t.Fatal(err)
		}
		return sub.Secret
	}

	// No ring, plain text not allowed: refused, naming the variable.
	t.Setenv("BRIDGE_SECRET_KEYS", "")
	for _, args := range [][]string{
		{"subscriptions", "create", "--url", "https://a.example/", "--event-types", "*"},
		{"subscriptions", "rotate-secret", "6f1c2a9e-52c4-4c55-9d39-8f0c2d6c2f11"},
		{"secrets", "rotate-key"},
	} {
		code, _, stderr := runBridge(t, args...)
		if code != ExitUsage || !strings.Contains(stderr, "BRIDGE_SECRET_KEYS is required") {
			t.Errorf("bridge %s without keys: exit %d, stderr %q", strings.Join(args, " "), code, stderr)
		}
	}
	// bridge config says what it takes.
	if out := mustRunBridge(t, "config"); !strings.Contains(out, "BRIDGE_SECRET_KEYS                      (not set: required by deliver, run, secret writes and the admin API; format: <id>:<base64 of 32 random bytes>") {
		t.Errorf("bridge config without keys:\n%s", out)
	}
	// Plain text, allowed explicitly (as before the key ring existed).
	t.Setenv("BRIDGE_ALLOW_PLAINTEXT_SECRETS", "true")
	plain := []string{create("https://p1.example/"), create("https://p2.example/")}
	if got := storedSecrets(t, db); len(got) != 2 || got[0] != plain[0] {
		t.Fatalf("stored %q, want the plain-text secrets", got)
	}
	t.Setenv("BRIDGE_ALLOW_PLAINTEXT_SECRETS", "")
	// Under the older key only.
	t.Setenv("BRIDGE_SECRET_KEYS", test1Only)
	sealed := create("https://s1.example/")
	if got := storedSecrets(t, db); len(got) != 3 || !strings.HasPrefix(got[2], "enc:v1:test-1:") || strings.Contains(got[2], sealed) {
		t.Fatalf("stored %q, want the third sealed under test-1", got)
	}

	// A new key first: status, then rotate-key.
	t.Setenv("BRIDGE_SECRET_KEYS", keyringtest.Keys)
	if out := mustRunBridge(t, "config"); !strings.Contains(out, "[REDACTED] keys: test-2 (encrypts), test-1") || strings.Contains(out, strings.Split(test1Only, ":")[1]) {
		t.Errorf("bridge config with keys:\n%s", out)
	}
	status := mustRunBridge(t, "secrets", "status")
	for _, want := range []string{"(plain text)  2", "test-1        1        older: run rotate-key"} {
		if !strings.Contains(status, want) {
			t.Errorf("secrets status:\n%s\nwant a line with %q", status, want)
		}
	}
	var rep struct {
		KeyID         string         `json:"key_id"`
		Resealed      int            `json:"resealed"`
		FromPlaintext int            `json:"from_plaintext"`
		FromKeys      map[string]int `json:"from_keys"`
		Batches       int            `json:"batches"`
		Remaining     int            `json:"remaining"`
	}
	if err := json.Unmarshal([]byte(mustRunBridge(t, "secrets", "rotate-key", "--batch", "2", "-o", "json")), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.KeyID != "test-2" || rep.Resealed != 3 || rep.FromPlaintext != 2 || rep.FromKeys["test-1"] != 1 || rep.Batches != 2 || rep.Remaining != 0 {
		t.Fatalf("rotate-key reported %+v", rep)
	}
	for _, s := range storedSecrets(t, db) {
		if !strings.HasPrefix(s, "enc:v1:test-2:") {
			t.Fatalf("after rotate-key the column holds %q", s)
		}
		for _, p := range append(plain, sealed) {
			if strings.Contains(s, strings.TrimPrefix(p, "whsec_")) {
				t.Fatalf("a stored value %q contains a secret", s)
			}
		}
	}
	if out := mustRunBridge(t, "secrets", "rotate-key"); !strings.Contains(out, "already under key test-2: nothing to do") {
		t.Errorf("second rotate-key: %q", out)
	}
	if status := mustRunBridge(t, "secrets", "status"); !strings.Contains(status, "test-2  3        current") {
		t.Errorf("secrets status after rotation:\n%s", status)
	}
	// Bad flags exit 2.
	if code, _, _ := runBridge(t, "secrets", "rotate-key", "--batch", "0"); code != ExitUsage {
		t.Errorf("--batch 0: exit %d", code)
	}
}

// A long-running command that uses secrets refuses to start without a key
// ring (before connecting), and refuses a ring that cannot open the stored
// secrets, naming the key; both exit 2 with one line.
func TestDeliverRefusesToStartWithoutTheKeys(t *testing.T) {
	t.Parallel()
	// Nothing listens on port 1: exit 2 means it refused before connecting.
	r := bridge(t, map[string]string{"DATABASE_URL": "postgres://bridge:bridge@127.0.0.1:1/bridge?sslmode=disable",
		"KAFKA_BROKERS": "127.0.0.1:1", "CONSUMER_TOPICS": "assets"}, "deliver")
	if r.code != ExitUsage || !strings.HasPrefix(r.stderr, "bridge: BRIDGE_SECRET_KEYS is required") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Errorf("deliver without keys: exit %d, stderr %q", r.code, r.stderr)
	}
	// The relay needs none, unless it serves the admin API.
	r = bridge(t, map[string]string{"DATABASE_URL": "postgres://bridge:bridge@127.0.0.1:1/bridge?sslmode=disable",
		"KAFKA_BROKERS": "127.0.0.1:1", "ADMIN_TOKEN": "an-admin-token-long-enough", "HTTP_ADDR": "127.0.0.1:0"}, "relay")
	if r.code != ExitUsage || !strings.Contains(r.stderr, "BRIDGE_SECRET_KEYS is required by the admin API") {
		t.Errorf("relay serving the admin API without keys: exit %d, stderr %q", r.code, r.stderr)
	}

	// One secret sealed under test-2.
	db := pgtest.New(t)
	cfg, err := config.Load(map[string]string{"DATABASE_URL": db.URL, "BRIDGE_SECRET_KEYS": keyringtest.Keys}, config.Needs{Database: true, Secrets: true})
	if err != nil {
		t.Fatal(err)
	}
	url := "https://a.example/"
	if _, err := subscriptionStore(cfg, db.Pool).Create(context.Background(), store.SubscriptionInput{URL: &url, EventTypes: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	// The row engine: the keys are opened before anything reads Kafka.
	env := map[string]string{"DATABASE_URL": db.URL, "HTTP_ADDR": "off", "DATABASE_CONNECT_TIMEOUT": "10s", "WEBHOOK_FAST_LANE": "false"}
	for name, keys := range map[string]string{
		"key missing":    test1Only,
		"wrong material": "test-2:" + strings.SplitN(test1Only, ":", 2)[1],
	} {
		env["BRIDGE_SECRET_KEYS"] = keys
		r := bridge(t, env, "deliver")
		if r.code != ExitUsage || !strings.Contains(r.stderr, `BRIDGE_SECRET_KEYS`) || !strings.Contains(r.stderr, `"test-2"`) || !strings.Contains(r.stderr, "1 stored signing secret(s) cannot be opened") {
			t.Errorf("%s: deliver exit %d, stderr %q; want exit 2 naming key test-2", name, r.code, r.stderr)
		}
	}
}

// Each start says so when secrets are (or will be) stored in plain text or
// under the published development key; never the key material.
func TestRuntimeWarnsAboutPlaintextAndDevKeys(t *testing.T) {
	db := pgtest.NewParallel(t)
	if _, err := db.Pool.Exec(context.Background(), `
WITH s AS (INSERT INTO bridge.subscriptions (url, event_types) VALUES ('https://a.example/', '{*}') RETURNING id)
INSERT INTO bridge.subscription_secrets (subscription_id, secret) SELECT id, 'whsec_cGxhaW4tdGV4dC1zZWNyZXQtcGxhaW4tdGV4dC1zZWM=' FROM s`); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		env  map[string]string
		want []string
	}{
		"plain text allowed": {map[string]string{"BRIDGE_ALLOW_PLAINTEXT_SECRETS": "true"},
			[]string{"BRIDGE_ALLOW_PLAINTEXT_SECRETS=true and no BRIDGE_SECRET_KEYS", "plaintext_secrets=1"}},
		"plain-text rows left": {map[string]string{"BRIDGE_SECRET_KEYS": keyringtest.Keys},
			[]string{"signing secrets stored in plain text: run bridge secrets rotate-key", "plaintext_secrets=1"}},
		"dev key": {map[string]string{"BRIDGE_SECRET_KEYS": keyring.DevKeys},
			[]string{"published development key", "key_ids=" + keyring.DevKeyID}},
	} {
		t.Run(name, func(t *testing.T) {
			tc.env["DATABASE_URL"] = db.URL
			cfg, err := config.Load(tc.env, config.Needs{Database: true, Secrets: true})
			if err != nil {
				t.Fatal(err)
			}
			cfg.HTTP.Addr = ""
			var logs bytes.Buffer
			rt, err := startRuntimeWith(context.Background(), cfg, serviceDeliver, deliverStage.uses, runtimeOptions{
				getenv: func(string) string { return "" }, logger: slog.New(slog.NewTextHandler(&logs, nil)), noGlobals: true})
			if err != nil {
				t.Fatal(err)
			}
			rt.Close()
			for _, w := range tc.want {
				if !strings.Contains(logs.String(), w) {
					t.Errorf("log lacks %q:\n%s", w, logs.String())
				}
			}
			if strings.Contains(logs.String(), "ZGV2LW9ubHk") || strings.Contains(logs.String(), "dGVzdC1rZXk") {
				t.Errorf("the log shows key material:\n%s", logs.String())
			}
		})
	}
}
