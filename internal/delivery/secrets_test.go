package delivery

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/keyring"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/webhooktest"
)

func parseRing(t *testing.T, items ...string) *keyring.Ring {
	t.Helper()
	r, err := keyring.Parse(items)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The key is rotated again and again while deliveries flow: the deliverer,
// holding both keys, signs every request with the subscriber's unchanged
// secret (the receiver verifies each one), nothing is lost or out of order,
// and once the last rotation is done a deliverer holding only the new key
// delivers too (the old key can go). Plain-text secrets from before the key
// ring are sealed by the first rotation without a delivery noticing.
func TestKeyRotationUnderLoadKeepsDeliveriesVerifying(t *testing.T) {
	b := setup(t)
	ctx := t.Context()
	const (
		matOld = "b2xkLWtleS1vbGQta2V5LW9sZC1rZXktb2xkLWtleSE=" // "old-key-old-key-old-key-old-key!"
		matNew = "bmV3LWtleS1uZXcta2V5LW5ldy1rZXktbmV3LWtleSE=" // "new-key-new-key-new-key-new-key!"
	)
	oldRing := parseRing(t, "old:"+matOld)
	toNew := parseRing(t, "new:"+matNew, "old:"+matOld)
	toOld := parseRing(t, "old:"+matOld, "new:"+matNew)

	rcv := webhooktest.New()
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)
	const subs, assets, perAsset = 4, 5, 30
	var ids []string
	for i := range subs {
		// Half written before the key ring existed (plain text).
		if i%2 == 0 {
			b.subs.WithKeys(nil)
		} else {
			b.subs.WithKeys(oldRing)
		}
		s := b.createSub(t, fmt.Sprintf("%s/s/%d", srv.URL, i))
		if err := rcv.SetSecret(fmt.Sprintf("/s/%d", i), s.Secret); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	_, stop := b.runDeliverer(t, Config{Keys: toNew, Workers: 8, RetrySchedule: []time.Duration{0, 50 * time.Millisecond}})

	// Deliveries arrive while rotate-key runs back and forth.
	var inserted atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := 1; n <= perAsset; n++ {
			for _, id := range ids {
				for a := range assets {
					b.insert(t, id, fmt.Sprintf("asset-%d", a), n, fmt.Sprintf(`{"n": %d}`, n))
					inserted.Add(1)
				}
			}
		}
	}()
	passes := 0
	for rotating := true; rotating; passes++ {
		select {
		case <-done:
			rotating = false
		default:
		}
		r := toNew
		if passes%2 == 1 {
			r = toOld
		}
		if _, err := store.RotateKeys(ctx, b.pool, r, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	if rep, err := store.RotateKeys(ctx, b.pool, toNew, 1, nil); err != nil || rep.Remaining != 0 {
		t.Fatalf("last pass: %+v, %v", rep, err)
	}
	total := subs * assets * perAsset
	testkit.Eventually(t, time.Minute, func() string {
		st := rcv.Stats()
		return testkit.Unless(st.Accepted == total, "receiver accepted %d of %d (%+v)", st.Accepted, total, st)
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st := rcv.Stats()
	if st.SignatureFailures != 0 || st.OrderViolations != 0 || st.Overlaps != 0 || st.NotReady != 0 {
		t.Fatalf("receiver: %+v", st)
	}
	t.Logf("%d deliveries verified across %d key rotation passes", total, passes+1)

	// Only the new key now: the old one is no longer needed.
	var stale int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM bridge.subscription_secrets WHERE secret NOT LIKE 'enc:v1:new:%'`).Scan(&stale); err != nil || stale != 0 {
		t.Fatalf("%d secrets not under the new key (%v)", stale, err)
	}
	b.runDeliverer(t, Config{Keys: parseRing(t, "new:"+matNew)})
	for _, id := range ids {
		b.insert(t, id, "after", 1, `{}`)
	}
	testkit.Eventually(t, 30*time.Second, func() string {
		st := rcv.Stats()
		return testkit.Unless(st.Accepted == total+subs && st.SignatureFailures == 0, "after dropping the old key: %+v", st)
	})
}

// A delivery whose secret cannot be opened fails its attempt with an error
// naming the key (visible in the attempt log), and the deliverer keeps
// delivering to every other subscription.
func TestMissingKeyFailsOnlyThatSubscriptionsAttempts(t *testing.T) {
	b := setup(t)
	rcv := newReceiver(t, nil)
	b.subs.WithKeys(parseRing(t, "gone:b2xkLWtleS1vbGQta2V5LW9sZC1rZXktb2xkLWtleSE="))
	lost := b.createSub(t, rcv.URL+"/lost")
	keys := parseRing(t, "kept:bmV3LWtleS1uZXcta2V5LW5ldy1rZXktbmV3LWtleSE=")
	b.subs.WithKeys(keys)
	fine := b.createSub(t, rcv.URL+"/fine")
	lostID := b.insert(t, lost.ID, "a", 1, `{}`)
	b.insert(t, fine.ID, "a", 1, `{}`)
	b.runDeliverer(t, Config{Keys: keys, RetrySchedule: []time.Duration{time.Hour}})
	var as []store.Attempt
	testkit.Eventually(t, 30*time.Second, func() string {
		var err error
		as, err = b.store.Attempts(context.Background(), lostID)
		return testkit.Unless(err == nil && len(rcv.requests()) == 1 && len(as) == 1, "requests %d, attempts logged %d (%v)", len(rcv.requests()), len(as), err)
	})
	if got := rcv.requests(); len(got) != 1 || got[0].Env.ID == "" {
		t.Fatalf("requests: %d", len(got))
	}
	if e := as[0].Error; !strings.Contains(e, `"gone"`) || !strings.Contains(e, keyring.Var) {
		t.Fatalf("attempt error %q does not name the missing key and %s", e, keyring.Var)
	}
}
