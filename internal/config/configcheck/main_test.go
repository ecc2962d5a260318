package main

import (
	"slices"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	resp, err := check(strings.NewReader(`{"environments": [
		{"name": "ok", "command": "relay", "env": {"DATABASE_URL": "postgres://u:p@db:5432/b", "KAFKA_BROKERS": "k:9092"}},
		{"name": "no-brokers", "command": "relay", "env": {"DATABASE_URL": "postgres://u:p@db:5432/b"}},
		{"name": "bad-tracing", "command": "deliver", "env": {"DATABASE_URL": "postgres://u:p@db:5432/b", "BRIDGE_ALLOW_PLAINTEXT_SECRETS": "true", "OTEL_TRACES_SAMPLER": "sometimes"}},
		{"name": "no-keys", "command": "deliver", "env": {"DATABASE_URL": "postgres://u:p@db:5432/b"}}
	]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(resp.Vars, "DATABASE_URL") || !slices.Contains(resp.TracingVars, "OTEL_SERVICE_NAME") {
		t.Errorf("vars %v, tracing vars %v", resp.Vars, resp.TracingVars)
	}
	if len(resp.Results) != 4 || resp.Results[0].Error != "" || !strings.Contains(resp.Results[1].Error, "KAFKA_BROKERS") || !strings.Contains(resp.Results[2].Error, "OTEL_TRACES_SAMPLER") ||
		!strings.Contains(resp.Results[3].Error, "BRIDGE_SECRET_KEYS is required") {
		t.Errorf("results %+v", resp.Results)
	}
	for _, bad := range []string{`{"environments": [{"name": "x", "command": "dance", "env": {}}]}`, `{"envs": []}`, `nope`} {
		if _, err := check(strings.NewReader(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
