package config_test

import (
	"strings"
	"testing"

	"github.com/outboxbridge/bridge/internal/config"
)

const (
	keyA = "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=" // 32 × 'A'
	keyB = "QkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkI=" // 32 × 'B'
)

// BRIDGE_SECRET_KEYS is validated at start-up by every command, naming the
// item at fault and never echoing key material; a command that writes or
// signs with secrets refuses to start without it unless plain text is
// allowed explicitly.
func TestLoadSecretKeys(t *testing.T) {
	cfg, err := config.Load(env(map[string]string{"BRIDGE_SECRET_KEYS": " k2:" + keyB + " , k1:" + keyA}), config.Needs{Database: true, Secrets: true})
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Secrets.Ring(); r == nil || r.CurrentID() != "k2" || !r.Has("k1") {
		t.Fatalf("ring %v", r)
	}
	for _, s := range cfg.Settings() {
		if s.Var == "BRIDGE_SECRET_KEYS" {
			if strings.Contains(s.Value, keyA) || strings.Contains(s.Value, keyB) || !strings.Contains(s.Value, "k2 (encrypts), k1") {
				t.Errorf("bridge config shows BRIDGE_SECRET_KEYS as %q: want the key ids only", s.Value)
			}
		}
	}

	for name, tc := range map[string]struct{ value, want string }{
		"no colon":      {"k1" + keyA, "key 1: is not <id>:<base64 key>"},
		"short key":     {"k1:" + keyA[:20], `key 1 ("k1"): key is 15 bytes, must be 32`},
		"not base64":    {"k1:" + keyA[:21], `key 1 ("k1"): key is not standard base64`},
		"16-byte key":   {"k1:QUFBQUFBQUFBQUFBQUFBQQ==", `key 1 ("k1"): key is 16 bytes, must be 32`},
		"duplicate id":  {"k1:" + keyA + ",k1:" + keyB, `key 2 ("k1"): appears twice`},
		"empty item":    {"k1:" + keyA + ",,k2:" + keyB, "empty item"},
		"bad id":        {"k/1:" + keyA, "may hold only"},
		"second is bad": {"k1:" + keyA + ",k2:" + keyB + "x", `key 2 ("k2")`},
	} {
		t.Run(name, func(t *testing.T) {
			// Even a command that does not use secrets (migrate) refuses a
			// malformed ring: it is a mistake wherever it is made.
			_, err := config.Load(env(map[string]string{"BRIDGE_SECRET_KEYS": tc.value}), config.Needs{Database: true})
			ce := requireConfigError(t, err, "BRIDGE_SECRET_KEYS")
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			if strings.Contains(err.Error(), keyA[:12]) || strings.Contains(err.Error(), keyB[:12]) || ce.Value != "" {
				t.Errorf("error %q shows key material", err)
			}
		})
	}

	// Required where secrets are written or signed with.
	_, err = config.Load(env(nil), config.Needs{Database: true, Secrets: true})
	requireConfigError(t, err, "BRIDGE_SECRET_KEYS")
	if !strings.Contains(err.Error(), "BRIDGE_ALLOW_PLAINTEXT_SECRETS=true") || !strings.Contains(err.Error(), "openssl rand -base64 32") {
		t.Errorf("error %q does not say how to make a key or how to run without", err)
	}
	// ... unless plain text is allowed explicitly, and not elsewhere.
	cfg, err = config.Load(env(map[string]string{"BRIDGE_ALLOW_PLAINTEXT_SECRETS": "true"}), config.Needs{Database: true, Secrets: true})
	if err != nil || cfg.Secrets.Ring() != nil || !cfg.Secrets.AllowPlaintext {
		t.Fatalf("plain text allowed: %v, %+v", err, cfg)
	}
	if _, err := config.Load(env(nil), config.Needs{Database: true}); err != nil {
		t.Fatalf("a command without secrets needs no ring: %v", err)
	}
	_, err = config.Load(env(map[string]string{"BRIDGE_ALLOW_PLAINTEXT_SECRETS": "maybe"}), config.Needs{Database: true})
	requireConfigError(t, err, "BRIDGE_ALLOW_PLAINTEXT_SECRETS")
}
