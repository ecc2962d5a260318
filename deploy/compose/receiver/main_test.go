package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/outboxbridge/bridge/internal/adminapi"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

// The receiver subscribes through the real admin API; started again, it
// rotates its subscription's secret instead of creating a second one.
func TestSubscribeThroughAdminAPI(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	mux := http.NewServeMux()
	adminapi.Mount(mux, adminapi.Config{Token: "tok", Pool: db.Pool, AllowHTTP: true, SecretGrace: time.Hour})
	api := httptest.NewServer(mux)
	defer api.Close()
	cfg := config{URL: "http://receiver:9000/webhook", EventTypes: []string{"*"}, AdminAPI: api.URL, AdminToken: "tok"}

	id1, secret1, err := subscribe(ctx, api.Client(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	id2, secret2, err := subscribe(ctx, api.Client(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if id1 != id2 || secret1 == secret2 || !strings.HasPrefix(secret2, "whsec_") {
		t.Fatalf("second start: id %s→%s, secret changed %v", id1, id2, secret1 != secret2)
	}
	subs, err := store.NewSubscriptionStore(db.Pool, true, time.Hour).List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(subs) != 1 || subs[0].URL != cfg.URL {
		t.Fatalf("subscriptions %+v, want one for %s", subs, cfg.URL)
	}
	cfg.AdminToken = "wrong"
	if _, _, err := subscribe(ctx, api.Client(), cfg); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("wrong token: %v", err)
	}
}

func TestWebhookVerifiesSignaturesAndOrder(t *testing.T) {
	t.Parallel()
	r := newReceiver(slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(r.routes())
	defer srv.Close()
	if code := get(t, srv.URL+"/healthz"); code != http.StatusServiceUnavailable {
		t.Fatalf("healthz before subscribing: %d", code)
	}
	secret := store.NewSecret()
	if err := r.setSecret(secret); err != nil {
		t.Fatal(err)
	}
	if code := get(t, srv.URL+"/healthz"); code != http.StatusOK {
		t.Fatalf("healthz after subscribing: %d", code)
	}
	signer, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := standardwebhooks.NewWebhook(store.NewSecret())
	send := func(wh *standardwebhooks.Webhook, id, asset string, seq int) int {
		body := fmt.Sprintf(`{"id":%q,"type":"asset.updated","asset_id":%q,"asset_seq":%d,"timestamp":"2025-01-01T00:00:00Z","data":{}}`, id, asset, seq)
		now := time.Now()
		sig, err := wh.Sign(id, now, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("POST", srv.URL+"/webhook", strings.NewReader(body))
		req.Header.Set("webhook-id", id)
		req.Header.Set("webhook-timestamp", fmt.Sprint(now.Unix()))
		req.Header.Set("webhook-signature", sig)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		wh        *standardwebhooks.Webhook
		id, asset string
		seq, code int
	}{
		{signer, "e1", "a", 1, 204},
		{signer, "e2", "a", 2, 204},
		{signer, "e3", "b", 1, 204},
		{signer, "e2", "a", 2, 204}, // redelivery (same webhook-id)
		{signer, "e0", "a", 1, 204}, // out of order: an older event of a, first seen after a:2
		{other, "e4", "a", 3, 401},  // wrong secret
	} {
		if code := send(c.wh, c.id, c.asset, c.seq); code != c.code {
			t.Fatalf("%s: %d, want %d", c.id, code, c.code)
		}
	}
	want := stats{Received: 6, Verified: 5, SignatureFailures: 1, OutOfOrder: 1, Redeliveries: 1}
	if got := r.snapshot(); got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
}

func get(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
