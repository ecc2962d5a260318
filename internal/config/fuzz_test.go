package config_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/keyring"
)

// parseEnvText reads "NAME=value" lines (the fuzzer's input) into an
// environment; a line without '=' is skipped.
func parseEnvText(s string) map[string]string {
	env := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && k != "" {
			env[k] = v
		}
	}
	return env
}

// secretParts are the values of env that must never appear in an error: the
// admin token, the SASL password and each key ring item's key material
// (long enough that a match is not an accident of the error's own words).
func secretParts(env map[string]string) []string {
	var out []string
	for _, k := range []string{"ADMIN_TOKEN", "KAFKA_SASL_PASSWORD"} {
		out = append(out, env[k])
	}
	for _, item := range strings.Split(env["BRIDGE_SECRET_KEYS"], ",") {
		if _, material, ok := strings.Cut(item, ":"); ok {
			out = append(out, strings.TrimSpace(material))
		}
	}
	return slices.DeleteFunc(out, func(s string) bool {
		if len(s) < 16 || strings.Contains(keyring.Format, s) {
			return true
		}
		// Also the value of another variable, which errors may echo.
		for k, v := range env {
			if k != "ADMIN_TOKEN" && k != "KAFKA_SASL_PASSWORD" && k != "BRIDGE_SECRET_KEYS" && strings.Contains(v, s) {
				return true
			}
		}
		return false
	})
}

// FuzzLoad: any environment loads or is refused with one line naming a
// variable the bridge reads (exit 2), never a panic, and never with a secret
// in the message; what loads with every need loads with none.
func FuzzLoad(f *testing.F) {
	for _, seed := range []string{
		"DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable",
		"DATABASE_URL=host=db user=bridge password=hunter2-hunter2-x dbname=bridge\nKAFKA_BROKERS=k1:9092, k2:9093",
		"DATABASE_URL=not a url\nHTTP_ADDR=:99999",
		"DATABASE_URL=postgres://u@h/d\nCONSUMER_TOPICS=a,,b\nWEBHOOK_ALLOWED_CIDRS=127.0.0.0/8, ::1/128",
		"DATABASE_URL=postgres://u@h/d\nWEBHOOK_RETRY_SCHEDULE=1s, 2s,-3s\nWEBHOOK_LEASE=10s",
		"DATABASE_URL=postgres://u@h/d\nBRIDGE_SECRET_KEYS=k2:QkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkI=,k1:QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=",
		"DATABASE_URL=postgres://u@h/d\nBRIDGE_SECRET_KEYS=k1:QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=,,k1:QUFBQUFBQUFBQUFBQUFBQQ==",
		"DATABASE_URL=postgres://u@h/d\nBRIDGE_ALLOW_PLAINTEXT_SECRETS=yes\nADMIN_TOKEN=0123456789abcdef0123",
		"KAFKA_SASL_MECHANISM=PLAIN\nKAFKA_SASL_USERNAME=u\nKAFKA_SASL_PASSWORD=0123456789abcdef-pass",
		"LOG_LEVEL=loud\nRELAY_BATCH_SIZE=0x10\nDATABASE_MAX_CONNS=1",
		"DATABASE_CONNECT_TIMEOUT=-1s\nKAFKA_LOG_LEVEL=none\nHTTP_ADDR=off",
	} {
		f.Add(seed)
	}
	known := map[string]bool{}
	for _, v := range config.Vars() {
		known[v] = true
	}
	all := config.Needs{Database: true, Kafka: true, Topics: true, Secrets: true}
	f.Fuzz(func(t *testing.T, text string) {
		env := parseEnvText(text)
		secrets := secretParts(env)
		for _, needs := range []config.Needs{all, {}} {
			_, err := config.Load(env, needs)
			if err == nil {
				continue
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Fatalf("env %q: error is more than one line: %q", env, msg)
			}
			var ce *config.Error
			if !errors.As(err, &ce) || !known[ce.Var] {
				t.Fatalf("env %q: error %q (%T) does not name a variable the bridge reads", env, msg, err)
			}
			for _, s := range secrets {
				if strings.Contains(msg, s) {
					t.Fatalf("env %q: error %q shows the secret %q", env, msg, s)
				}
			}
		}
		// Needs only add checks: what loads with all of them loads with none.
		if _, err := config.Load(env, all); err == nil {
			if _, err := config.Load(env, config.Needs{}); err != nil {
				t.Fatalf("env %q loads with every need but not with none: %v", env, err)
			}
		}
	})
}
