package adminapi

import (
	"fmt"
	"strings"
	"testing"

	"github.com/outboxbridge/bridge/internal/audit"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

// TestAPIActionsAudited: every write of the API leaves one audit entry
// (via api, the token's id, never the token or a secret) with its scope and
// the rows it changed; a refused write (bad input) leaves none.
func TestAPIActionsAudited(t *testing.T) {
	b, ctx := setup(t)
	sub := b.do(t, "POST", "/api/v1/subscriptions", `{"url": "http://localhost:9/hook", "event_types": ["*"]}`).want(t, 201).obj(t)
	id := sub["id"].(string)
	secret := sub["secret"].(string)
	b.do(t, "PATCH", "/api/v1/subscriptions/"+id, `{"description": "d"}`).want(t, 200)
	b.do(t, "POST", "/api/v1/subscriptions/"+id+"/rotate-secret", ``).want(t, 200)
	b.do(t, "POST", "/api/v1/subscriptions/"+id+"/disable", `{"reason": "maintenance"}`).want(t, 200)
	b.do(t, "POST", "/api/v1/subscriptions/"+id+"/enable", ``).want(t, 200)
	for _, topic := range []string{"a", "a", "b"} {
		if _, err := b.db.Pool.Exec(ctx, `SELECT bridge.enqueue($1, 'x', 'e', '{}')`, topic); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.db.Pool.Exec(ctx, `UPDATE bridge.outbox SET status = 'FAILED', failed_at = now()`); err != nil {
		t.Fatal(err)
	}
	b.do(t, "POST", "/api/v1/outbox/replay", `{"all_failed": true, "topic": "a"}`).want(t, 200)
	b.do(t, "POST", "/api/v1/deliveries/revive", `{"subscription_id": "`+id+`", "dead": true}`).want(t, 200)
	b.do(t, "POST", "/api/v1/deliveries/revive", `{"ids": [1, 2]}`).want(t, 200)
	b.do(t, "POST", "/api/v1/deliveries/recover", `{"subscription_id": "`+id+`", "since": "1h"}`).want(t, 200)
	b.do(t, "POST", "/api/v1/outbox/replay", `{"ids": ["not-a-uuid"]}`).wantError(t, 400, "ids[0]")
	b.do(t, "DELETE", "/api/v1/subscriptions/"+id, ``).want(t, 204)

	type row struct {
		Actor, Via, Remote, Action, Target, Scope string
		Rows                                      int64
	}
	got := pgtest.Structs[row](t, b.db.Pool, `SELECT actor, via, remote, action, target, scope, row_count FROM bridge.audit_log ORDER BY id`)
	want := []string{
		audit.SubscriptionCreate + " " + id + " [] 1",
		audit.SubscriptionUpdate + " " + id + " [] 1",
		audit.SubscriptionRotate + " " + id + " [] 1",
		audit.SubscriptionDisable + " " + id + " [] 1",
		audit.SubscriptionEnable + " " + id + " [] 1",
		audit.OutboxReplayMatching + "  [all FAILED topic=a] 2",
		audit.DeliveriesReviveSub + " " + id + " [all dead] 0",
		audit.DeliveriesRevive + "  [2 ids] 0",
		audit.DeliveriesRecover + " " + id + " [dead, created since",
		audit.SubscriptionDelete + " " + id + " [] 1",
	}
	if len(got) != len(want) {
		t.Fatalf("%d audit entries, want %d: %+v", len(got), len(want), got)
	}
	for i, g := range got {
		line := fmt.Sprintf("%s %s [%s] %d", g.Action, g.Target, g.Scope, g.Rows)
		if !strings.HasPrefix(line, want[i]) {
			t.Errorf("entry %d = %q, want %q…", i, line, want[i])
		}
		if g.Via != audit.ViaAPI || g.Actor != audit.TokenID(testToken) || g.Remote == "" {
			t.Errorf("entry %d: %+v", i, g)
		}
		if strings.Contains(line+g.Actor, testToken) || strings.Contains(line, secret) {
			t.Errorf("entry %d holds the token or a secret: %q", i, line)
		}
	}
}
