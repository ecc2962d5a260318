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
		{"name": "bad-tracing", "command": "deliver", "env": {"DATABASE_URL": "postgres://u:p@db:5432/b", "KAFKA_BROKERS": "k:9092", "CONSUMER_TOPICS": "assets", "BRIDGE_ALLOW_PLAINTEXT_SECRETS": "true", "OTEL_TRACES_SAMPLER": "sometimes"}},
		{"name": "no-keys", "command": "deliver", "env": {"DATABASE_URL": "postgres://u:p@db:5432/b", "KAFKA_BROKERS": "k:9092", "CONSUMER_TOPICS": "assets"}},
		{"name": "consume-beside-the-fast-lane", "command": "consume", "env": {"DATABASE_URL": "postgres://u:p@db:5432/b", "KAFKA_BROKERS": "k:9092", "CONSUMER_TOPICS": "assets"}},
		{"name": "consume-row-engine", "command": "consume", "env": {"DATABASE_URL": "postgres://u:p@db:5432/b", "KAFKA_BROKERS": "k:9092", "CONSUMER_TOPICS": "assets", "WEBHOOK_FAST_LANE": "false"}},
		{"name": "deliver-without-topics", "command": "deliver", "env": {"DATABASE_URL": "postgres://u:p@db:5432/b", "KAFKA_BROKERS": "k:9092", "BRIDGE_ALLOW_PLAINTEXT_SECRETS": "true"}},
		{"name": "deliver-row-engine", "command": "deliver", "env": {"DATABASE_URL": "postgres://u:p@db:5432/b", "BRIDGE_ALLOW_PLAINTEXT_SECRETS": "true", "WEBHOOK_FAST_LANE": "false"}}
	]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(resp.Vars, "DATABASE_URL") || !slices.Contains(resp.TracingVars, "OTEL_SERVICE_NAME") {
		t.Errorf("vars %v, tracing vars %v", resp.Vars, resp.TracingVars)
	}
	// The delivery path is checked as the commands check it: the fast lane
	// (the default) refuses `bridge consume` and needs the topics for
	// `bridge deliver`; the row engine needs neither.
	if len(resp.Results) != 8 || resp.Results[0].Error != "" || !strings.Contains(resp.Results[1].Error, "KAFKA_BROKERS") || !strings.Contains(resp.Results[2].Error, "OTEL_TRACES_SAMPLER") ||
		!strings.Contains(resp.Results[3].Error, "BRIDGE_SECRET_KEYS is required") ||
		!strings.HasPrefix(resp.Results[4].Error, "WEBHOOK_FAST_LANE") || resp.Results[5].Error != "" ||
		!strings.HasPrefix(resp.Results[6].Error, "CONSUMER_TOPICS is required by `bridge deliver`") || resp.Results[7].Error != "" {
		t.Errorf("results %+v", resp.Results)
	}
	for _, bad := range []string{`{"environments": [{"name": "x", "command": "dance", "env": {}}]}`, `{"envs": []}`, `nope`} {
		if _, err := check(strings.NewReader(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
