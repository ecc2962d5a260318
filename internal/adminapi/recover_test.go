package adminapi

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

func TestRecoverRevivesTheWindowAndRefusesBadInput(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSubscription(t, "https://a.example.com/h")
	ids := b.deliveries(t, sub, 4, "m")
	// Created 4h, 3h, 2h and 1h ago.
	for i, id := range ids {
		if _, err := b.db.Pool.Exec(ctx, `UPDATE bridge.deliveries SET created_at = now() - make_interval(hours => $2) WHERE id = $1`, id, 4-i); err != nil {
			t.Fatal(err)
		}
	}
	dead := func() int {
		var n int
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries WHERE status = 'dead'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	for _, c := range []struct{ body, field string }{
		{fmt.Sprintf(`{"subscription_id": %q, "since": %q}`, sub, future), "since"},
		{fmt.Sprintf(`{"subscription_id": %q, "since": "last tuesday"}`, sub), "since"},
		{fmt.Sprintf(`{"subscription_id": %q}`, sub), "since"},
		{fmt.Sprintf(`{"subscription_id": %q, "since": "3h", "until": "4h"}`, sub), "until"},
		{fmt.Sprintf(`{"subscription_id": %q, "since": "3h", "until": ""}`, sub), "until"},
		{`{"subscription_id": "00000000-0000-4000-8000-000000000000", "since": "3h"}`, "subscription_id"},
		{`{"subscription_id": "x", "since": "3h"}`, "subscription_id"},
		{`{"since": "3h"}`, "subscription_id"},
	} {
		b.do(t, "POST", "/api/v1/deliveries/recover", c.body).wantError(t, http.StatusBadRequest, c.field)
	}
	if n := dead(); n != 4 {
		t.Fatalf("bad input revived deliveries: %d dead left, want 4", n)
	}
	// [3h30m ago, 1h30m ago): the ones created 3h and 2h ago, oldest first.
	res := b.do(t, "POST", "/api/v1/deliveries/recover", fmt.Sprintf(`{"subscription_id": %q, "since": "3h30m", "until": %q}`,
		sub, time.Now().Add(-90*time.Minute).UTC().Format(time.RFC3339Nano))).want(t, http.StatusOK).obj(t)
	if got := fmt.Sprint(res["recovered"], res["ids"]); got != fmt.Sprintf("2 [%d %d]", ids[1], ids[2]) {
		t.Fatalf("recover = %v, want 2 [%d %d]", got, ids[1], ids[2])
	}
	if n := dead(); n != 2 {
		t.Fatalf("%d dead left, want 2", n)
	}
	res = b.do(t, "POST", "/api/v1/deliveries/recover", fmt.Sprintf(`{"subscription_id": %q, "since": "3h30m", "until": "1h30m"}`, sub)).
		want(t, http.StatusOK).obj(t)
	if fmt.Sprint(res["recovered"], res["ids"]) != "0 []" {
		t.Fatalf("an emptied window = %v", res)
	}
}
