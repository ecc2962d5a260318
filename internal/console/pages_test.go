package console_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/outboxbridge/bridge/internal/adminapi"
	"github.com/outboxbridge/bridge/internal/console"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

// TestEveryPageRendersEmpty: on an empty database every page answers 200
// with its page (a template that fails on an empty list or a zero count is
// a 500), and the answers to bad input name what is wrong.
func TestEveryPageRendersEmpty(t *testing.T) {
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
	u := "http://127.0.0.1:9/x"
	sub, err := store.NewSubscriptionStore(db.Pool, true, 0).Create(t.Context(), store.SubscriptionInput{URL: &u, EventTypes: []string{"*"}})
	if err != nil {
		t.Fatal(err)
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
	for path, want := range map[string]string{
		"/ui/":                                    "FAILED outbox rows",
		"/ui/outbox":                              "0 FAILED rows match",
		"/ui/outbox?status=NEW":                   "No NEW rows",
		"/ui/outbox?status=SENT&topic=x":          "No SENT rows match this filter",
		"/ui/outbox/replay?topic=x":               "Replay <strong id=\"confirm-count\">0</strong> FAILED rows",
		"/ui/subscriptions":                       "1 subscription.",
		"/ui/subscriptions/" + sub.ID:             "secret 1 created",
		"/ui/subscriptions/" + sub.ID + "/secret": "was shown once",
		"/ui/deliveries":                          "No deliveries match",
		"/ui/deliveries?status=dead&subscription=" + sub.ID:           "Revive all dead that match",
		"/ui/deliveries/revive?subscription=" + sub.ID:                "Revive all <strong id=\"confirm-count\">0</strong> dead deliveries",
		"/ui/deliveries/recover?subscription=" + sub.ID + "&since=2h": "confirm-count\">0</strong> dead deliveries",
		"/ui/streams?subscription=" + sub.ID:                          "Nothing open in this stream",
		"/ui/audit":                                                   "Nothing has been done yet",
		"/ui/search":                                                  "is also its event",
		"/ui/search?q=42":                                             "Nothing has the id",
	} {
		status, body := get(path)
		if status != http.StatusOK && !(strings.HasSuffix(path, "/secret") && status == http.StatusGone) {
			t.Errorf("GET %s: %d", path, status)
			continue
		}
		if !strings.Contains(body, want) {
			t.Errorf("GET %s does not say %q", path, want)
		}
	}
	for path, want := range map[string]string{
		"/ui/outbox?status=LOST":                                            "the outbox views are FAILED, NEW and SENT",
		"/ui/outbox?status=SENT&after=nope":                                 "not a cursor",
		"/ui/deliveries/recover?subscription=" + sub.ID:                     "since: is required",
		"/ui/deliveries/recover?subscription=" + sub.ID + "&since=tomorrow": "neither an RFC 3339 time",
		"/ui/audit?after=x":                                                 "not a cursor",
	} {
		status, body := get(path)
		if status < 400 || status >= 500 || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d, want a 4xx saying %q", path, status, want)
		}
	}
}
