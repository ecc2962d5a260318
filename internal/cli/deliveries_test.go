package cli

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxbridge/bridge/internal/pgtest"
)

func TestDeliveriesCLILogNeverPrintsPayloads(t *testing.T) {
	db, ctx := webhookCLIEnv(t)
	const marker = "PAYLOAD-MARKER-c41d"
	sub := insertSubscription(t, db)
	var id int64
	err := db.Pool.QueryRow(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at,
  status, attempts, dead_at, last_error, last_status_code)
VALUES ($1, 'evt-1', 'asset.updated', 'assets', 'a1', 1, jsonb_build_object('secret', $2::text), now(),
  'dead', 1, now(), 'HTTP 500 Internal Server Error', 500) RETURNING id`, sub, marker).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO bridge.delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code, error, response_body)
VALUES ($1, 1, now(), 12.5, 500, 'HTTP 500 Internal Server Error', 'upstream exploded')`, id); err != nil {
		t.Fatal(err)
	}
	ids := strconv.FormatInt(id, 10)
	for _, args := range [][]string{
		{"deliveries", "list"}, {"deliveries", "list", "-o", "json"},
		{"deliveries", "list", "--subscription", sub, "--status", "dead", "--asset", "a1"},
		{"deliveries", "attempts", ids}, {"deliveries", "attempts", ids, "-o", "json"},
		{"deliveries", "show", ids}, {"deliveries", "show", ids, "-o", "json"},
	} {
		out := mustRunBridge(t, args...)
		if strings.Contains(out, marker) {
			t.Errorf("bridge %s printed the payload:\n%s", strings.Join(args, " "), out)
		}
		if !strings.Contains(out, "500") {
			t.Errorf("bridge %s does not show the attempt's status:\n%s", strings.Join(args, " "), out)
		}
	}
	if out := mustRunBridge(t, "deliveries", "attempts", ids); !strings.Contains(out, "upstream exploded") {
		t.Errorf("attempts does not show the response body:\n%s", out)
	}
	for _, args := range [][]string{{"deliveries", "show", ids, "--payload"}, {"deliveries", "show", ids, "--payload", "-o", "json"}} {
		if out := mustRunBridge(t, args...); !strings.Contains(out, marker) {
			t.Errorf("bridge %s does not print the payload:\n%s", strings.Join(args, " "), out)
		}
	}
	// The null-asset filter and paging.
	var page struct {
		Deliveries []json.RawMessage `json:"items"`
		NextCursor string            `json:"next_cursor"`
	}
	if err := json.Unmarshal([]byte(mustRunBridge(t, "deliveries", "list", "--asset", "", "-o", "json")), &page); err != nil || len(page.Deliveries) != 0 {
		t.Fatalf("null-asset filter returned %d rows (%v)", len(page.Deliveries), err)
	}

	// Revive by id, then by subscription (nothing left dead).
	var revived struct{ Revived []int64 }
	if err := json.Unmarshal([]byte(mustRunBridge(t, "deliveries", "revive", ids, "-o", "json")), &revived); err != nil || len(revived.Revived) != 1 || revived.Revived[0] != id {
		t.Fatalf("revive = %+v (%v)", revived, err)
	}
	var status string
	var attempts int
	if err := db.Pool.QueryRow(ctx, `SELECT status, attempts FROM bridge.deliveries WHERE id = $1`, id).Scan(&status, &attempts); err != nil || status != "pending" || attempts != 0 {
		t.Fatalf("after revive: %s with %d attempts (%v), want pending with 0", status, attempts, err)
	}
	if out := mustRunBridge(t, "deliveries", "revive", "--subscription", sub, "--dead"); !strings.Contains(out, "revived 0") {
		t.Errorf("second revive: %s", out)
	}
	// By id again: the delivery is pending now, 999999 does not exist;
	// each is named with its reason, and nothing revived with an id naming
	// nothing exits 2 (not found); with every id existing, 1. Nothing was
	// revived, so nothing is promised about delivery.
	if code, out, errOut := runBridge(t, "deliveries", "revive", ids); code != ExitRuntime || strings.Contains(out, "once their subscription is enabled") {
		t.Errorf("revive of a pending delivery: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut := runBridge(t, "deliveries", "revive", ids, "999999")
	if code != ExitUsage || !strings.Contains(out, "not revived: "+ids+" is pending, not dead") ||
		!strings.Contains(out, "not revived: 999999 no such delivery") || !strings.Contains(errOut, "none of the 2") {
		t.Errorf("revive of ids not dead: exit %d\n%s\n%s", code, out, errOut)
	}
}

func TestDeliveriesCLIPaging(t *testing.T) {
	db, ctx := webhookCLIEnv(t)
	sub := insertSubscription(t, db)
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, payload, event_created_at)
SELECT $1, 'e' || g, 't', 'assets', '{}', now() FROM generate_series(1, 5) g`, sub); err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	after := ""
	for range 10 {
		args := []string{"deliveries", "list", "--limit", "2", "-o", "json"}
		if after != "" {
			args = append(args, "--cursor", after)
		}
		var page struct {
			Deliveries []struct{ ID int64 } `json:"items"`
			NextCursor string               `json:"next_cursor"`
		}
		if err := json.Unmarshal([]byte(mustRunBridge(t, args...)), &page); err != nil {
			t.Fatal(err)
		}
		for _, d := range page.Deliveries {
			if seen[d.ID] {
				t.Fatalf("delivery %d on two pages", d.ID)
			}
			seen[d.ID] = true
		}
		if page.NextCursor == "" {
			break
		}
		after = page.NextCursor
	}
	if len(seen) != 5 {
		t.Fatalf("paging saw %d deliveries, want 5", len(seen))
	}
	// The table's hint is the whole next command, filters included; run
	// as printed, it gives the next page of the same filter.
	out := mustRunBridge(t, "deliveries", "list", "--status", "pending", "--limit", "2")
	i := strings.Index(out, "more: ")
	if i < 0 {
		t.Fatalf("no next-page hint:\n%s", out)
	}
	hint := strings.Fields(strings.TrimSpace(out[i+len("more: "):]))
	if strings.Join(hint[:7], " ") != "bridge deliveries list --status pending --limit 2" || hint[7] != "--cursor" {
		t.Fatalf("hint %q does not repeat the filters", hint)
	}
	if next := mustRunBridge(t, hint[1:]...); strings.Count(next, "  pending  ") != 2 || !strings.Contains(next, "--cursor") {
		t.Errorf("the hinted command does not give the next 2 pending:\n%s", next)
	}
	// --after, the flag's first name, still works.
	if code, _, errOut := runBridge(t, "deliveries", "list", "--after", hint[8]); code != ExitOK {
		t.Errorf("--after: exit %d %s", code, errOut)
	}
}

// Every listing's -o json has one shape, the admin API's:
// {"items": [...], "next_cursor": …} (next_cursor only when there is more).
func TestListingsShareOneJSONShape(t *testing.T) {
	db, ctx := webhookCLIEnv(t)
	sub := insertSubscription(t, db)
	var id int64
	if err := db.Pool.QueryRow(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, payload, event_created_at)
VALUES ($1, 'e1', 't', 'assets', '{}', now()) RETURNING id`, sub).Scan(&id); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"subscriptions", "list", "-o", "json"},
		{"deliveries", "list", "-o", "json"},
		{"deliveries", "attempts", strconv.FormatInt(id, 10), "-o", "json"},
		{"outbox", "failed", "-o", "json"},
	} {
		var page map[string]json.RawMessage
		out := mustRunBridge(t, args...)
		if err := json.Unmarshal([]byte(out), &page); err != nil {
			t.Errorf("bridge %s: not a JSON object: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		var items []json.RawMessage
		if err := json.Unmarshal(page["items"], &items); err != nil || items == nil {
			t.Errorf("bridge %s: no items array: %s", strings.Join(args, " "), out)
		}
		for k := range page {
			if k != "items" && k != "next_cursor" {
				t.Errorf("bridge %s: field %q besides items and next_cursor", strings.Join(args, " "), k)
			}
		}
	}
}

// insertSubscription adds a subscription to every event type with plain SQL
// (the CLI under test reads it; creating it is not what is tested) and
// returns its id.
func insertSubscription(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	var id string
	if err := db.Pool.QueryRow(context.Background(), `INSERT INTO bridge.subscriptions (url, event_types) VALUES ('https://x.example/', '{*}') RETURNING id::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}
