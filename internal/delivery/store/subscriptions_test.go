package store

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateURL(t *testing.T) {
	t.Parallel()
	cases := []struct {
		url       string
		allowHTTP bool
		ok        bool
	}{
		{"https://hooks.example.com/in", false, true},
		{"https://hooks.example.com:8443/in?x=1", false, true},
		{"http://hooks.example.com/in", false, false},
		{"http://hooks.example.com/in", true, true},
		{"ftp://hooks.example.com/in", true, false},
		{"hooks.example.com/in", true, false},
		{"/relative", true, false},
		{"https://", false, false},
		{"https://user:pw@hooks.example.com/", false, false},
		{"", false, false},
		{"https://exa mple.com/", false, false},
	}
	for _, c := range cases {
		err := ValidateURL(c.url, c.allowHTTP)
		if (err == nil) != c.ok {
			t.Errorf("ValidateURL(%q, allowHTTP=%v) = %v, want ok=%v", c.url, c.allowHTTP, err, c.ok)
		}
		var ve *ValidationError
		if err != nil && (!errors.As(err, &ve) || ve.Field != "url") {
			t.Errorf("ValidateURL(%q) error %v does not name the url field", c.url, err)
		}
	}
	if err := ValidateURL("http://x.example/", false); !strings.Contains(err.Error(), "WEBHOOK_ALLOW_HTTP") {
		t.Errorf("http refusal %q does not say how to allow it", err)
	}
}

// The patterns themselves are contract.ValidateEventTypes's (its test has
// every case); here: the store refuses what it refuses, naming the field.
func TestValidateEventTypes(t *testing.T) {
	t.Parallel()
	if err := validateEventTypes([]string{"asset.*", "order.paid"}); err != nil {
		t.Errorf("valid patterns refused: %v", err)
	}
	for _, types := range [][]string{nil, {"asset.*", ""}, {"as*et"}, {"asset created"}} {
		err := validateEventTypes(types)
		var ve *ValidationError
		if !errors.As(err, &ve) || ve.Field != "event-types" {
			t.Errorf("validateEventTypes(%q) = %v, want a ValidationError naming event-types", types, err)
		}
	}
}

func TestSubscriptionLifecycle(t *testing.T) {
	b, ctx := setup(t)
	b.subs.AllowHTTP = false
	if _, err := b.subs.Create(ctx, SubscriptionInput{URL: ptr("http://x.example/"), EventTypes: []string{"*"}}); err == nil {
		t.Fatal("created an http subscription without WEBHOOK_ALLOW_HTTP")
	}
	sub, err := b.subs.Create(ctx, SubscriptionInput{URL: ptr("https://x.example/in"), EventTypes: []string{"asset.*"}, Topic: ptr("assets"), Description: ptr("CRM")})
	if err != nil {
		t.Fatal(err)
	}
	if sub.Secret == "" || sub.Topic != "assets" || !sub.Enabled {
		t.Fatalf("created %+v", sub)
	}
	got := b.sub(t, sub.ID)
	if got.Secret != "" || len(got.Secrets) != 1 {
		t.Fatalf("show reveals the secret or lists %d secrets: %+v", len(got.Secrets), got)
	}
	up, err := b.subs.Update(ctx, sub.ID, SubscriptionInput{EventTypes: []string{"order.paid"}, Topic: ptr("")})
	if err != nil || up.URL != "https://x.example/in" || up.Topic != "" || up.EventTypes[0] != "order.paid" || up.Description != "CRM" {
		t.Fatalf("update = %+v, %v", up, err)
	}
	if _, err := b.subs.Update(ctx, sub.ID, SubscriptionInput{EventTypes: []string{}}); err == nil {
		t.Fatal("update accepted empty event types")
	}
	rot, err := b.subs.RotateSecret(ctx, sub.ID)
	if err != nil || rot.Secret == sub.Secret || len(rot.Secrets) != 2 || rot.Secrets[0].ExpiresAt == nil {
		t.Fatalf("rotate = %+v, %v; want a new secret and the old one expiring", rot, err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.subscriptions SET consecutive_failures = 3 WHERE id = $1`, sub.ID); err != nil {
		t.Fatal(err)
	}
	d, err := b.subs.Disable(ctx, sub.ID, "maintenance")
	if err != nil || d.Enabled || d.DisabledReason != "maintenance" {
		t.Fatalf("disable = %+v, %v", d, err)
	}
	e, err := b.subs.Enable(ctx, sub.ID)
	if err != nil || !e.Enabled || e.ConsecutiveFailures != 0 || e.DisabledReason != "" {
		t.Fatalf("enable = %+v, %v; want enabled with the failure count reset", e, err)
	}
	if err := b.subs.Delete(ctx, sub.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.subs.Get(ctx, sub.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get after delete = %v, want ErrNotFound", err)
	}
	if err := b.subs.Delete(ctx, sub.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete = %v, want ErrNotFound", err)
	}
	var ve *ValidationError
	if _, err := b.subs.Get(ctx, "not-a-uuid"); !errors.As(err, &ve) {
		t.Fatalf("get of a bad id = %v, want a ValidationError", err)
	}
}

func TestRotatedOutSecretStopsSigningAfterGrace(t *testing.T) {
	b, ctx := setup(t)
	b.subs.SecretGrace = 0
	sub := b.createSub(t, "https://x.example/")
	rot, err := b.subs.RotateSecret(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	b.insert(t, sub.ID, "a", 1, `{}`)
	cs := claimOnce(t, b, "w", 1)
	if len(cs) != 1 || len(cs[0].Secrets) != 1 || cs[0].Secrets[0] != rot.Secret {
		t.Fatalf("claim carries secrets %v, want only the new one", cs[0].Secrets)
	}
}
