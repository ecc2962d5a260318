// Package keyringtest is the key ring tests run with: published, so only for
// tests (start-up does not warn about it as it does about keyring.DevKeys,
// which would clutter the logs tests read).
package keyringtest

import (
	"strings"
	"testing"

	"github.com/outboxbridge/bridge/internal/keyring"
)

// Keys is a BRIDGE_SECRET_KEYS value: key "test-2" encrypts, "test-1"
// decrypts too.
const Keys = "test-2:dGVzdC1rZXktdHdvLXRoaXJ0eS10d28tYnl0ZXMhISE=,test-1:dGVzdC1rZXktb25lLXRoaXJ0eS10d28tYnl0ZXMhISE="

// Ring is Keys parsed.
func Ring(t testing.TB) *keyring.Ring {
	t.Helper()
	r, err := keyring.Parse(strings.Split(Keys, ","))
	if err != nil {
		t.Fatal(err)
	}
	return r
}
