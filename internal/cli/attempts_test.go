package cli

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// `bridge deliveries attempts` reads the fast lane's log: a delivery the
// fast lane made alone by --subscription/--event, paged with --cursor
// (oldest first, nothing repeated or skipped); a parked delivery by its id,
// with its fast-lane attempt before the slow lane's.
func TestDeliveriesAttemptsReadsBothLanes(t *testing.T) {
	db, ctx := webhookCLIEnv(t)
	sub := insertSubscription(t, db)
	st := store.NewDeliveryStore(db.Pool)
	start := time.Now().UTC().Add(-time.Minute).Truncate(time.Microsecond)
	if err := st.EnsureAttemptPartitions(ctx, start, 1); err != nil {
		t.Fatal(err)
	}
	var fast []store.FastAttempt
	for i := range 5 {
		fast = append(fast, store.FastAttempt{SubscriptionID: sub, EventID: "evt-fast", EventType: "t", Topic: "assets",
			Partition: 1, Offset: int64(10 + i), Attempt: i + 1,
			Outcome: store.Outcome{StartedAt: start.Add(time.Duration(i) * time.Second), Duration: time.Millisecond, StatusCode: 500 + i, Error: "fast-" + strconv.Itoa(i+1)}})
	}
	fast = append(fast, store.FastAttempt{SubscriptionID: sub, EventID: "evt-parked", EventType: "t", Topic: "assets",
		Attempt: 1, Outcome: store.Outcome{StartedAt: start, StatusCode: 503, Error: "fast-parked"}})
	if err := st.LogFastAttempts(ctx, fast, nil); err != nil {
		t.Fatal(err)
	}

	type page struct {
		Items      []store.Attempt `json:"items"`
		NextCursor string          `json:"next_cursor"`
	}
	var seen []string
	args := []string{"deliveries", "attempts", "--subscription", sub, "--event", "evt-fast", "--limit", "2", "-o", "json"}
	for cursor, n := "", 0; ; n++ {
		if n > 5 {
			t.Fatal("paging does not end")
		}
		var p page
		out := mustRunBridge(t, append(args, "--cursor", cursor)...)
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, a := range p.Items {
			if a.Lane != store.LaneFast || *a.StatusCode != 499+a.Attempt {
				t.Fatalf("attempt %+v: want lane fast and status %d", a, 499+a.Attempt)
			}
			seen = append(seen, a.Error)
		}
		if cursor = p.NextCursor; cursor == "" {
			break
		}
	}
	if got := strings.Join(seen, ","); got != "fast-1,fast-2,fast-3,fast-4,fast-5" {
		t.Fatalf("attempts over the pages: %s", got)
	}
	table := mustRunBridge(t, "deliveries", "attempts", "--subscription", sub, "--event", "evt-fast", "--limit", "4")
	if !strings.Contains(table, "fast-4") || strings.Contains(table, "fast-5") || !strings.Contains(table, "more: bridge deliveries attempts --subscription") {
		t.Fatalf("table's first page:\n%s", table)
	}

	var id int64
	if err := db.Pool.QueryRow(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, payload, event_created_at, attempts)
VALUES ($1, 'evt-parked', 't', 'assets', '{}', now(), 2) RETURNING id`, sub).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO bridge.delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code, error)
VALUES ($1, 2, $2, 1, 502, 'slow-2')`, id, start.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	var p page
	if err := json.Unmarshal([]byte(mustRunBridge(t, "deliveries", "attempts", strconv.FormatInt(id, 10), "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Items) != 2 || p.Items[0].Lane != store.LaneFast || p.Items[0].Error != "fast-parked" ||
		p.Items[1].Lane != store.LaneSlow || p.Items[1].Error != "slow-2" {
		t.Fatalf("parked delivery's attempts: %+v", p.Items)
	}

	for _, bad := range [][]string{
		{"deliveries", "attempts"},
		{"deliveries", "attempts", "--subscription", sub},
		{"deliveries", "attempts", "1", "--event", "e"},
		{"deliveries", "attempts", "--subscription", "nope", "--event", "e"},
		{"deliveries", "attempts", "--subscription", sub, "--event", "e", "--cursor", "x"},
	} {
		if code, _, errOut := runBridge(t, bad...); code != ExitUsage || errOut == "" {
			t.Errorf("bridge %s: exit %d %q, want a usage error", strings.Join(bad, " "), code, errOut)
		}
	}
}
