package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/outboxbridge/bridge/internal/audit"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

// The operator commands against a database with NEW, SENT and FAILED rows:
// stats and failed report them (payloads only with --payload), replay needs a
// selector and returns FAILED rows to NEW with attempts reset; -o json works
// for scripts; bad flags exit 2.
func TestCLIOutboxStatsFailedReplay(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	var ids []uuid.UUID
	for _, asset := range []string{"a", "b", "c", "d"} {
		var id uuid.UUID
		if err := db.Pool.QueryRow(ctx, `SELECT bridge.enqueue('assets', $1, 'asset.created', '{"secret-payload": true}')`, asset).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.outbox SET status = 'SENT', sent_at = now() WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.outbox SET status = 'FAILED', attempts = 10, failed_at = now(), last_error = 'MESSAGE_TOO_LARGE' WHERE id = ANY($1)`, ids[1:3]); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": db.URL}

	r := bridge(t, env, "outbox", "stats", "-o", "json")
	var st struct {
		ByStatus      map[string]int64 `json:"by_status"`
		FailedByTopic map[string]int64 `json:"failed_by_topic"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
		t.Fatalf("stats: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if st.ByStatus["NEW"] != 1 || st.ByStatus["SENT"] != 1 || st.ByStatus["FAILED"] != 2 || st.FailedByTopic["assets"] != 2 {
		t.Fatalf("stats = %+v", st)
	}
	if r := bridge(t, env, "outbox", "stats"); r.code != 0 || !strings.Contains(r.stdout, "FAILED") || !strings.Contains(r.stdout, "oldest NEW row") {
		t.Fatalf("stats table: %q", r.stdout)
	}

	r = bridge(t, env, "outbox", "failed", "--topic", "assets")
	if r.code != 0 || !strings.Contains(r.stdout, ids[1].String()) || !strings.Contains(r.stdout, "MESSAGE_TOO_LARGE") {
		t.Fatalf("failed: %q %q", r.stdout, r.stderr)
	}
	if strings.Contains(r.stdout, "secret-payload") {
		t.Fatal("failed printed a payload without --payload")
	}
	if r := bridge(t, env, "outbox", "failed", "--payload", "-o", "json"); r.code != 0 || !strings.Contains(r.stdout, "secret-payload") {
		t.Fatalf("failed --payload -o json: %q", r.stdout)
	}

	for _, bad := range [][]string{
		{"outbox", "replay"},
		{"outbox", "replay", "--id", "not-a-uuid"},
		{"outbox", "replay", "--id", ids[1].String(), "--all-failed"},
		{"outbox", "replay", "--id", ids[1].String(), "--topic", "assets"},
		{"outbox", "failed", "--limit", "0"},
		{"outbox", "stats", "-o", "yaml"},
	} {
		if r := bridge(t, env, bad...); r.code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", bad, r.code, r.stderr)
		}
	}

	r = bridge(t, env, "outbox", "replay", "--id", ids[1].String(), "-o", "json")
	if r.code != 0 || !strings.Contains(r.stdout, `"replayed": 1`) {
		t.Fatalf("replay --id: %q %q", r.stdout, r.stderr)
	}
	r = bridge(t, env, "outbox", "replay", "--all-failed", "--topic", "assets", "--since", "1h")
	if r.code != 0 || !strings.Contains(r.stdout, "replayed 1 row") {
		t.Fatalf("replay --all-failed: %q %q", r.stdout, r.stderr)
	}
	var news, attempts int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(attempts), 0) FROM bridge.outbox WHERE status = 'NEW'`).Scan(&news, &attempts); err != nil {
		t.Fatal(err)
	}
	if news != 3 || attempts != 0 {
		t.Fatalf("after replay: %d NEW rows with %d attempts, want 3 with 0", news, attempts)
	}

	// Ids that are not FAILED (ids[1] is NEW again) or do not exist are
	// reported with the reason; none replayed is not "replayed 0": exit 2
	// when an id names nothing (not found, as everywhere), 1 when every id
	// exists in another state.
	const unknown = "0b7c6a4e-5f0e-4f43-9d4c-2f3f0f6b8e11"
	if r := bridge(t, env, "outbox", "replay", "--id", ids[1].String()); r.code != 1 || !strings.Contains(r.stdout, "is NEW, not FAILED") {
		t.Fatalf("replay of a NEW row: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	r = bridge(t, env, "outbox", "replay", "--id", ids[1].String(), "--id", unknown)
	if r.code != 2 || !strings.Contains(r.stdout, "not replayed: "+ids[1].String()+" is NEW, not FAILED") ||
		!strings.Contains(r.stdout, "not replayed: "+unknown+" no such outbox row") || !strings.Contains(r.stderr, "none of the 2 id(s)") {
		t.Fatalf("replay of ids not FAILED: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	r = bridge(t, env, "outbox", "replay", "--id", unknown, "-o", "json")
	var js struct {
		Replayed    int `json:"replayed"`
		NotReplayed []struct {
			ID, Reason string
		} `json:"not_replayed"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &js); err != nil || r.code != 2 || js.Replayed != 0 || len(js.NotReplayed) != 1 || js.NotReplayed[0].Reason != "no such outbox row" {
		t.Fatalf("replay -o json of an unknown id: exit %d %+v (%v)\n%s", r.code, js, err, r.stdout)
	}
}

// `outbox failed` pages like every listing: --limit is bounded (1-1000), a
// full page ends with the command for the next one, and following the
// cursors lists every FAILED row once, in seq order.
func TestCLIOutboxFailedPagesByCursor(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `SELECT bridge.enqueue('assets', 'a' || i, 'asset.created', '{}') FROM generate_series(1, 25) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.outbox SET status = 'FAILED', attempts = 10, failed_at = now(), last_error = 'x'`); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": db.URL}
	for _, bad := range [][]string{{"--limit", "100000000"}, {"--limit", "1001"}, {"--cursor", "abc"}} {
		if r := bridge(t, env, append([]string{"outbox", "failed"}, bad...)...); r.code != 2 || !strings.Contains(r.stderr, strings.TrimPrefix(bad[0], "--")) {
			t.Errorf("failed %v: exit %d %q, want 2", bad, r.code, r.stderr)
		}
	}
	seen := map[string]bool{}
	var pages int
	args := []string{"outbox", "failed", "--limit", "10", "-o", "json"}
	for {
		r := bridge(t, env, args...)
		var page struct {
			Items      []struct{ ID string } `json:"items"`
			NextCursor string                `json:"next_cursor"`
		}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &page) != nil {
			t.Fatalf("%v: exit %d %q %q", args, r.code, r.stdout, r.stderr)
		}
		pages++
		for _, it := range page.Items {
			if seen[it.ID] {
				t.Fatalf("row %s listed twice", it.ID)
			}
			seen[it.ID] = true
		}
		if page.NextCursor == "" {
			break
		}
		args = []string{"outbox", "failed", "--limit", "10", "-o", "json", "--cursor", page.NextCursor}
	}
	if len(seen) != 25 || pages != 3 {
		t.Errorf("%d rows in %d pages, want 25 in 3", len(seen), pages)
	}
	if r := bridge(t, env, "outbox", "failed", "--limit", "10"); r.code != 0 || !strings.Contains(r.stdout, "more: bridge outbox failed --limit=10 --cursor ") {
		t.Errorf("table page does not print the next command: %q", r.stdout)
	}
}

// TestCLIAuditList: `bridge audit list` pages the audit log newest first by
// cursor, in a table (with the next page's command) and as -o json; a bad
// cursor is a usage error.
func TestCLIAuditList(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	for i := range 5 {
		if err := audit.Record(ctx, db.Pool, audit.Entry{Actor: "token:0123abcd", Via: audit.ViaAPI, Remote: "192.0.2.7",
			Action: audit.OutboxReplayMatching, Scope: fmt.Sprintf("topic=t%d", i), Rows: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	env := map[string]string{"DATABASE_URL": db.URL}
	var scopes []string
	cursor := ""
	for page := 0; page < 5; page++ {
		args := []string{"audit", "list", "--limit", "2", "-o", "json"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		r := bridge(t, env, args...)
		var l struct {
			Items []audit.Entry `json:"items"`
			Next  string        `json:"next_cursor"`
		}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &l) != nil {
			t.Fatalf("audit list: exit %d, %q %q", r.code, r.stdout, r.stderr)
		}
		for _, e := range l.Items {
			scopes = append(scopes, e.Scope)
		}
		if cursor = l.Next; cursor == "" {
			break
		}
	}
	if got := strings.Join(scopes, ","); got != "topic=t4,topic=t3,topic=t2,topic=t1,topic=t0" {
		t.Fatalf("pages gave %s", got)
	}
	r := bridge(t, env, "audit", "list", "--limit", "2")
	if r.code != 0 || !strings.Contains(r.stdout, "outbox.replay_matching") || !strings.Contains(r.stdout, "192.0.2.7") ||
		!strings.Contains(r.stdout, "more: bridge audit list --limit 2 --cursor ") {
		t.Fatalf("audit list table: %q %q", r.stdout, r.stderr)
	}
	if r := bridge(t, env, "audit", "list", "--cursor", "x"); r.code != 2 || !strings.Contains(r.stderr, "--cursor") {
		t.Fatalf("bad cursor: exit %d, %q", r.code, r.stderr)
	}
}
