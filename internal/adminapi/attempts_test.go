package adminapi

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// walkAttempts pages an attempt listing with limit and returns each
// attempt's "lane/error".
func (b *bundle) walkAttempts(t *testing.T, path string, limit int) []string {
	t.Helper()
	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("paging does not end")
		}
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		u := fmt.Sprintf("%s%slimit=%d", path, sep, limit)
		if cursor != "" {
			u += "&cursor=" + url.QueryEscape(cursor)
		}
		res := b.do(t, "GET", u, "").want(t, http.StatusOK)
		items := res.items(t)
		if len(items) > limit {
			t.Fatalf("page of %d over limit %d", len(items), limit)
		}
		for _, it := range items {
			if _, ok := it["payload"]; ok {
				t.Fatalf("an attempt carries a payload: %v", it)
			}
			got = append(got, fmt.Sprint(it["lane"], "/", it["error"]))
		}
		cursor, _ = res.obj(t)["next_cursor"].(string)
		if cursor == "" {
			return got
		}
	}
}

// The admin API lists the fast lane's attempts: by (subscription, event id)
// for a delivery that has no row, by delivery id for one the fast lane
// parked (its fast-lane attempt first); oldest first, paging neither
// repeats nor skips.
func TestAttemptsEndpointsReadBothLanes(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSubscription(t, "https://a.example.com/h")
	st := store.NewDeliveryStore(b.db.Pool)
	start := time.Now().UTC().Add(-time.Minute).Truncate(time.Microsecond)
	if err := st.EnsureAttemptPartitions(ctx, start, 1); err != nil {
		t.Fatal(err)
	}
	var fast []store.FastAttempt
	var want []string
	for i := range 5 {
		fast = append(fast, store.FastAttempt{SubscriptionID: sub, EventID: "evt-fast", EventType: "t", Topic: "assets",
			Partition: 0, Offset: int64(i), Attempt: i + 1,
			Outcome: store.Outcome{StartedAt: start.Add(time.Duration(i) * time.Second), StatusCode: 500, Error: fmt.Sprint("f", i+1)}})
		want = append(want, fmt.Sprint("fast/f", i+1))
	}
	ids := b.deliveries(t, sub, 1, "m")
	var parkedEvent string
	if err := b.db.Pool.QueryRow(ctx, `SELECT event_id FROM bridge.deliveries WHERE id = $1`, ids[0]).Scan(&parkedEvent); err != nil {
		t.Fatal(err)
	}
	fast = append(fast, store.FastAttempt{SubscriptionID: sub, EventID: parkedEvent, EventType: "t", Topic: "assets",
		Attempt: 1, Outcome: store.Outcome{StartedAt: start, StatusCode: 503, Error: "parked-first"}})
	if err := st.LogFastAttempts(ctx, fast, nil); err != nil {
		t.Fatal(err)
	}

	for _, limit := range []int{1, 2, 5, 100} {
		got := b.walkAttempts(t, "/api/v1/attempts?subscription="+sub+"&event=evt-fast", limit)
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("limit %d: %v, want %v", limit, got, want)
		}
	}
	got := b.walkAttempts(t, fmt.Sprintf("/api/v1/deliveries/%d/attempts", ids[0]), 1)
	if len(got) < 2 || got[0] != "fast/parked-first" || !strings.HasPrefix(got[1], "slow/") {
		t.Fatalf("parked delivery's attempts: %v, want the fast lane's first, then the slow lane's", got)
	}
	if n := len(b.do(t, "GET", "/api/v1/attempts?subscription="+sub+"&event=nothing", "").want(t, http.StatusOK).items(t)); n != 0 {
		t.Fatalf("%d attempts of an unknown event", n)
	}

	b.do(t, "GET", "/api/v1/attempts?event=e", "").wantError(t, http.StatusBadRequest, "subscription")
	b.do(t, "GET", "/api/v1/attempts?subscription="+sub, "").wantError(t, http.StatusBadRequest, "event")
	b.do(t, "GET", "/api/v1/attempts?subscription=nope&event=e", "").wantError(t, http.StatusBadRequest, "subscription")
	b.do(t, "GET", "/api/v1/attempts?subscription="+sub+"&event=e&cursor=bm9wZQ", "").wantError(t, http.StatusBadRequest, "cursor")
	b.do(t, "GET", "/api/v1/attempts?subscription="+sub+"&event=e&cursor="+encodeCursor(cursorAttempts, "1.2"), "").wantError(t, http.StatusBadRequest, "cursor")
	b.do(t, "GET", fmt.Sprintf("/api/v1/deliveries/%d/attempts?limit=0", ids[0]), "").wantError(t, http.StatusBadRequest, "limit")
}
