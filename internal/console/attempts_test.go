package console_test

import (
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/adminapi"
	"github.com/outboxbridge/bridge/internal/console"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

var attemptRow = regexp.MustCompile(`<td class="n">(\d+)</td><td class="lane">(\w+)</td>`)

// The console shows the fast lane's attempts: /ui/attempts lists those of a
// delivery the fast lane made without a row (by subscription and event id),
// oldest first, and its next-page links neither repeat nor skip one; the
// page of a parked delivery lists its fast-lane attempt before the slow
// lane's.
func TestConsoleShowsFastLaneAttempts(t *testing.T) {
	db := pgtest.NewParallel(t)
	mux := http.NewServeMux()
	ui, err := console.Mount(mux, console.Config{Config: adminapi.Config{Token: token, Pool: db.Pool, AllowHTTP: true, AllowedCIDRs: loopback}})
	if err != nil || ui == nil {
		t.Fatalf("Mount: %v, %v", ui, err)
	}
	defer ui.Close()
	srv := httptest.NewServer(mux)
	defer srv.Close()
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar}
	if res, err := client.PostForm(srv.URL+"/ui/login", url.Values{"token": {token}}); err != nil || res.StatusCode != 200 {
		t.Fatalf("sign in: %v %v", res, err)
	}
	get := func(path string) (int, string) {
		t.Helper()
		res, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	ctx := t.Context()
	u := "http://127.0.0.1:9/x"
	sub, err := store.NewSubscriptionStore(db.Pool, true, 0).Create(ctx, store.SubscriptionInput{URL: &u, EventTypes: []string{"*"}})
	if err != nil {
		t.Fatal(err)
	}
	st := store.NewDeliveryStore(db.Pool)
	start := time.Now().UTC().Add(-time.Hour).Truncate(time.Microsecond)
	if err := st.EnsureAttemptPartitions(ctx, start, 1); err != nil {
		t.Fatal(err)
	}
	// More than a page (100): the link to the next one is followed.
	const n = 130
	var fast []store.FastAttempt
	for i := range n {
		fast = append(fast, store.FastAttempt{SubscriptionID: sub.ID, EventID: "evt-fast", EventType: "t", Topic: "assets",
			Partition: 0, Offset: int64(i), Attempt: i + 1,
			Outcome: store.Outcome{StartedAt: start.Add(time.Duration(i) * time.Second), StatusCode: 500, Error: "boom"}})
	}
	fast = append(fast, store.FastAttempt{SubscriptionID: sub.ID, EventID: "evt-parked", EventType: "t", Topic: "assets",
		Attempt: 1, Outcome: store.Outcome{StartedAt: start, StatusCode: 503, Error: "parked-first"}})
	if err := st.LogFastAttempts(ctx, fast, nil); err != nil {
		t.Fatal(err)
	}

	var seen []int
	path := "/ui/attempts?subscription=" + sub.ID + "&event=evt-fast"
	for pages := 0; path != ""; pages++ {
		if pages > 3 {
			t.Fatal("next-page links do not end")
		}
		status, body := get(path)
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, status, body)
		}
		for _, m := range attemptRow.FindAllStringSubmatch(body, -1) {
			if m[2] != store.LaneFast {
				t.Fatalf("attempt %s shown as lane %s", m[1], m[2])
			}
			var a int
			fmt.Sscan(m[1], &a)
			seen = append(seen, a)
		}
		path = ""
		if m := regexp.MustCompile(`id="next-page" href="([^"]+)"`).FindStringSubmatch(body); m != nil {
			path = html.UnescapeString(m[1])
		}
	}
	if len(seen) != n {
		t.Fatalf("%d attempts over the pages, want %d", len(seen), n)
	}
	for i, a := range seen {
		if a != i+1 {
			t.Fatalf("attempt %d at position %d: repeated, skipped or out of order", a, i)
		}
	}

	var id int64
	if err := db.Pool.QueryRow(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, payload, event_created_at, attempts)
VALUES ($1, 'evt-parked', 't', 'assets', '{"never":"shown"}', now(), 2) RETURNING id`, sub.ID).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO bridge.delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code, error)
VALUES ($1, 2, now(), 1, 502, 'slow-second')`, id); err != nil {
		t.Fatal(err)
	}
	status, body := get(fmt.Sprintf("/ui/deliveries/%d", id))
	rows := attemptRow.FindAllStringSubmatch(body, -1)
	if status != http.StatusOK || len(rows) != 2 || rows[0][2] != store.LaneFast || rows[1][2] != store.LaneSlow ||
		!strings.Contains(body, "parked-first") || strings.Contains(body, "never") {
		t.Fatalf("delivery page: %d, rows %v\n%s", status, rows, body)
	}

	for p, want := range map[string]string{
		"/ui/attempts?event=e":                                      "both are required",
		"/ui/attempts?subscription=nope&event=e":                    "not a UUID",
		"/ui/attempts?subscription=" + sub.ID + "&event=e&cursor=x": "not a cursor",
	} {
		if status, body := get(p); status != http.StatusBadRequest || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d, want 400 saying %q", p, status, want)
		}
	}
}
