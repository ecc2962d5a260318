package delivery

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/outboxbridge/bridge/internal/delivery/store"
)

func TestSecretFormatAndSign(t *testing.T) {
	t.Parallel()
	s := store.NewSecret()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
	if !strings.HasPrefix(s, "whsec_") || err != nil || len(key) != 32 {
		t.Fatalf("secret %q: want whsec_ + base64 of 32 bytes (%v, %d bytes)", s, err, len(key))
	}
	if store.NewSecret() == s {
		t.Fatal("two secrets are equal")
	}
	other := store.NewSecret()
	ts := time.Now()
	body := []byte(`{"id":"e1"}`)
	sig, err := Sign([]string{s, other}, "e1", ts.Unix(), body)
	if err != nil {
		t.Fatal(err)
	}
	// A second signature reuses each secret's pooled MAC: it must start
	// from a clean state.
	if again, _ := Sign([]string{s, other}, "e1", ts.Unix(), body); again != sig {
		t.Fatalf("signing twice gave %q, then %q", sig, again)
	}
	if parts := strings.Split(sig, " "); len(parts) != 2 || !strings.HasPrefix(parts[1], "v1,") {
		t.Fatalf("signature header %q: want two space-separated v1, signatures", sig)
	}
	for _, secret := range []string{s, other} {
		wh, _ := standardwebhooks.NewWebhook(secret)
		want, _ := wh.Sign("e1", ts, body)
		if !strings.Contains(sig, want) {
			t.Errorf("signature header %q lacks %q", sig, want)
		}
	}
}
