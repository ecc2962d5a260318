package cli

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

func TestTermSafe(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{"plain text", "plain text"},
		{"café ✓ 日本", "café ✓ 日本"},
		{"\x1b]0;pwned\x07\x1b[2J", `\x1b]0;pwned\a\x1b[2J`},
		{"a\nb\tc\rd", `a\nb\tc\rd`},
		{"del\x7f", `del\x7f`},
		{"c1 \u009b31m", `c1 \u009b31m`},
		{"bidi \u202eevil", `bidi \u202eevil`},
		{"bad \xff utf8", `bad \xff utf8`},
		{"kept \ufffd", "kept \ufffd"},
	}
	for _, c := range cases {
		if got := termSafe(c.in); got != c.want {
			t.Errorf("termSafe(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestTablesEscapeControlCharacters: what an endpoint answered, what an
// operator typed as a reason and an application's asset id reach the
// table escaped, never raw; -o json keeps them exact.
func TestTablesEscapeControlCharacters(t *testing.T) {
	db, ctx := webhookCLIEnv(t)
	const evil = "\x1b]0;owned\x07\x1b[2J"
	var sub string
	if err := db.Pool.QueryRow(ctx, `INSERT INTO bridge.subscriptions (url, event_types, enabled, disabled_reason, disabled_at)
VALUES ('https://x.example/', '{*}', false, $1, now()) RETURNING id::text`, "reason "+evil).Scan(&sub); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := db.Pool.QueryRow(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at,
  status, attempts, dead_at, last_error, last_status_code)
VALUES ($1, 'evt-1', 'asset.updated', 'assets', $2, 1, '{}', now(), 'dead', 1, now(), 'HTTP 500', 500) RETURNING id`,
		sub, "row\nbreak\tasset").Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO bridge.delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code, error, response_body)
VALUES ($1, 1, now(), 1, 500, 'HTTP 500', $2)`, id, "answer "+evil); err != nil {
		t.Fatal(err)
	}
	ids := strconv.FormatInt(id, 10)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"deliveries", "attempts", ids}, `answer \x1b]0;owned\a\x1b[2J`},
		{[]string{"subscriptions", "show", sub}, `reason \x1b]0;owned\a\x1b[2J`},
		{[]string{"subscriptions", "list"}, sub},
		{[]string{"deliveries", "list"}, `row\nbreak\tasset`},
		{[]string{"deliveries", "show", ids}, `row\nbreak\tasset`},
	} {
		out := mustRunBridge(t, c.args...)
		if strings.ContainsAny(out, "\x1b\x07\t\r") {
			t.Errorf("bridge %s printed a raw control character:\n%q", strings.Join(c.args, " "), out)
		}
		if !strings.Contains(out, c.want) {
			t.Errorf("bridge %s does not show %q escaped:\n%s", strings.Join(c.args, " "), c.want, out)
		}
		// Every table line is one row: a newline in a cell would add lines.
		if c.args[1] == "list" || c.args[1] == "attempts" {
			if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 {
				t.Errorf("bridge %s printed %d lines, want a header and one row:\n%s", strings.Join(c.args, " "), len(lines), out)
			}
		}
	}
	var as struct {
		Items []struct {
			ResponseBody string `json:"response_body"`
		}
	}
	if err := json.Unmarshal([]byte(mustRunBridge(t, "deliveries", "attempts", ids, "-o", "json")), &as); err != nil || len(as.Items) != 1 || as.Items[0].ResponseBody != "answer "+evil {
		t.Errorf("attempts -o json = %+v (%v), want the answer exactly as stored", as, err)
	}
}
