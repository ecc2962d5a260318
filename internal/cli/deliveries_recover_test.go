package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// A row-engine installation (WEBHOOK_FAST_LANE=false): every delivery is a
// row, and recover reads bridge.deliveries only.
func TestDeliveriesRecoverRevivesOnlyTheWindowAndRefusesBadInput(t *testing.T) {
	db, ctx := webhookCLIEnv(t)
	t.Setenv("WEBHOOK_FAST_LANE", "false")
	sub, other := insertSubscription(t, db), insertSubscription(t, db)
	base := time.Date(2026, 3, 1, 2, 0, 0, 0, time.UTC)
	insert := func(sub string, n int, status string, created time.Time) int64 {
		t.Helper()
		var id int64
		err := db.Pool.QueryRow(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at,
  status, attempts, dead_at, last_error, created_at)
VALUES ($1::uuid, 'evt-' || $2::bigint || '-' || $1::text, 'asset.updated', 'assets', 'a1', $2::bigint, '{}', $3,
  $4::text, 9, CASE WHEN $4::text = 'dead' THEN now() END, 'HTTP 500', $3) RETURNING id`, sub, n, created, status).Scan(&id)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	before := insert(sub, 1, "dead", base.Add(5*time.Minute))
	in1 := insert(sub, 2, "dead", base.Add(15*time.Minute))
	in2 := insert(sub, 3, "dead", base.Add(2*time.Hour))
	pendingIn := insert(sub, 4, "pending", base.Add(2*time.Hour))
	after := insert(sub, 5, "dead", base.Add(3*time.Hour))
	otherIn := insert(other, 1, "dead", base.Add(time.Hour))
	deadCount := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries WHERE status = 'dead'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Bad input: exit 2 naming the flag, nothing revived.
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--subscription", sub, "--since", future}, "--since"},
		{[]string{"--subscription", sub, "--since", "yesterday"}, "--since"},
		{[]string{"--subscription", sub}, "--since"},
		{[]string{"--subscription", sub, "--since", "2026-03-01T04:00:00Z", "--until", "2026-03-01T03:00:00Z"}, "--until"},
		{[]string{"--subscription", sub, "--since", "2026-03-01T04:00:00Z", "--until", "soon"}, "--until"},
		{[]string{"--subscription", "00000000-0000-0000-0000-000000000001", "--since", "2026-03-01T02:10:00Z"}, "--subscription"},
		{[]string{"--subscription", "nope", "--since", "2026-03-01T02:10:00Z"}, "--subscription"},
		{[]string{"--since", "2026-03-01T02:10:00Z"}, "--subscription"},
	} {
		code, out, errOut := runBridge(t, append([]string{"deliveries", "recover"}, c.args...)...)
		if code != ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("recover %v: exit %d, stderr %q (stdout %q); want exit 2 naming %s", c.args, code, errOut, out, c.want)
		}
	}
	if n := deadCount(); n != 5 {
		t.Fatalf("bad input changed deliveries: %d dead, want 5", n)
	}

	var res struct {
		Recovered int
		IDs       []int64
	}
	out := mustRunBridge(t, "deliveries", "recover", "--subscription", sub,
		"--since", "2026-03-01T02:10:00Z", "--until", "2026-03-01T02:40:00Z", "-o", "json")
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Recovered != 1 || len(res.IDs) != 1 || res.IDs[0] != in1 {
		t.Fatalf("recover 02:10–02:40 = %s (%v); want only %d", out, err, in1)
	}
	// Open-ended: up to now.
	out = mustRunBridge(t, "deliveries", "recover", "--subscription", sub, "--since", "2026-03-01T02:10:00Z")
	if !strings.Contains(out, "recovered 2 dead deliveries") {
		t.Fatalf("open-ended recover: %s", out)
	}
	status := func(id int64) (string, int) {
		var s string
		var a int
		if err := db.Pool.QueryRow(ctx, `SELECT status, attempts FROM bridge.deliveries WHERE id = $1`, id).Scan(&s, &a); err != nil {
			t.Fatal(err)
		}
		return s, a
	}
	for _, id := range []int64{in1, in2, after} {
		if s, a := status(id); s != "pending" || a != 0 {
			t.Errorf("delivery %d in the window: %s with %d attempts, want pending with 0", id, s, a)
		}
	}
	for _, id := range []int64{before, otherIn} {
		if s, _ := status(id); s != "dead" {
			t.Errorf("delivery %d outside the window or of another subscription: %s, want dead", id, s)
		}
	}
	if s, a := status(pendingIn); s != "pending" || a != 9 {
		t.Errorf("a pending delivery in the window was touched: %s with %d attempts", s, a)
	}
	out = mustRunBridge(t, "deliveries", "recover", "--subscription", sub, "--since", "2026-03-01T02:10:00Z")
	if !strings.Contains(out, "no dead deliveries") {
		t.Fatalf("recovering an empty window: %s", out)
	}
}

// With the fast lane (the default) a delivered event has no row, so recover
// reads the window from the event topics: run where only PostgreSQL is
// configured (a row-engine habit), it refuses before writing anything,
// naming the variable it needs and the way back.
func TestDeliveriesRecoverWithTheFastLaneNamesTheTopicsItReads(t *testing.T) {
	db, ctx := webhookCLIEnv(t)
	sub := insertSubscription(t, db)
	for _, v := range []string{"WEBHOOK_FAST_LANE", "KAFKA_BROKERS", "CONSUMER_TOPICS"} {
		t.Setenv(v, "")
	}
	code, _, stderr := runBridge(t, "deliveries", "recover", "--subscription", sub, "--since", "1h")
	if code != ExitUsage || !strings.Contains(stderr, "KAFKA_BROKERS is required to recover a window with WEBHOOK_FAST_LANE (the default)") ||
		!strings.Contains(stderr, "WEBHOOK_FAST_LANE=false") {
		t.Fatalf("exit %d, stderr %q: want 2, naming KAFKA_BROKERS, the fast lane and the way back", code, stderr)
	}
	t.Setenv("KAFKA_BROKERS", "127.0.0.1:1")
	if code, _, stderr = runBridge(t, "deliveries", "recover", "--subscription", sub, "--since", "1h"); code != ExitUsage ||
		!strings.Contains(stderr, "CONSUMER_TOPICS is required to recover a window") {
		t.Fatalf("exit %d, stderr %q: want 2, naming CONSUMER_TOPICS", code, stderr)
	}
	var revived int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries`).Scan(&revived); err != nil || revived != 0 {
		t.Fatalf("%d delivery rows (%v): a refused recover writes none", revived, err)
	}
}
