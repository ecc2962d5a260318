package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/keyring"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

const (
	matA = "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=" // 32 × 'A'
	matB = "QkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkI=" // 32 × 'B'
)

func ring(t testing.TB, items ...string) *keyring.Ring {
	t.Helper()
	r, err := keyring.Parse(items)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// rawSecrets reads a subscription's stored secrets as the database holds
// them, oldest first.
func (b *testBundle) rawSecrets(t testing.TB, subID string) []string {
	t.Helper()
	return pgtest.Column[string](t, b.pool, `SELECT secret FROM bridge.subscription_secrets WHERE subscription_id = $1 ORDER BY id`, subID)
}

// claimOne claims the one pending delivery of the test.
func (b *testBundle) claimOne(t testing.TB, ds *DeliveryStore) Claim {
	t.Helper()
	cs, err := ds.Claim(context.Background(), ClaimParams{ClaimedBy: "t", Limit: 10, MaxInFlight: 10, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 {
		t.Fatalf("claimed %d, want 1", len(cs))
	}
	return cs[0]
}

// The column never holds a secret in plain text: create and rotate seal it
// under the current key, bound to the subscription, and the claim opens it
// back to exactly what create and rotate showed.
func TestSecretsSealedAtRest(t *testing.T) {
	b, _ := setup(t)
	keys := ring(t, "k2:"+matB, "k1:"+matA)
	b.subs.WithKeys(keys)
	ds := NewDeliveryStore(b.pool).WithKeys(keys)
	sub := b.createSub(t, "https://a.example/hook")
	raw := b.rawSecrets(t, sub.ID)
	if len(raw) != 1 || !strings.HasPrefix(raw[0], "enc:v1:k2:") || strings.Contains(raw[0], sub.Secret) ||
		strings.Contains(raw[0], strings.TrimPrefix(sub.Secret, SecretPrefix)) {
		t.Fatalf("stored %q for secret %q: want it sealed under k2", raw, sub.Secret)
	}
	rotated, err := b.subs.RotateSecret(context.Background(), sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	raw = b.rawSecrets(t, sub.ID)
	for _, r := range raw {
		if !keyring.IsSealed(r) || strings.Contains(r, "whsec_") {
			t.Fatalf("after rotation the column holds %q", r)
		}
	}
	b.insert(t, sub.ID, "a", 1, `{}`)
	c := b.claimOne(t, ds)
	if c.SecretsErr != nil || len(c.Secrets) != 2 || c.Secrets[0] != rotated.Secret || c.Secrets[1] != sub.Secret {
		t.Fatalf("claim secrets %q (err %v), want [new old] = [%q %q]", c.Secrets, c.SecretsErr, rotated.Secret, sub.Secret)
	}
}

// A secret that cannot be opened fails its own claim's attempt, naming the
// key and the subscription, and nobody else's: a key missing from the ring,
// the wrong key under the right id, a tampered value, a value copied from
// another subscription's row.
func TestUnopenableSecretFailsOnlyItsDeliveryNamingTheKey(t *testing.T) {
	b, ctx := setup(t)
	sealing := ring(t, "k1:"+matA)
	b.subs.WithKeys(sealing)
	bad := b.createSub(t, "https://bad.example/hook")
	good := b.createSub(t, "https://good.example/hook")

	// claimBoth adds one delivery to each subscription, on an asset of its
	// own (the earlier ones stay in flight), and claims them.
	claimBoth := func(asset string, ds *DeliveryStore) map[string]Claim {
		t.Helper()
		b.insert(t, bad.ID, asset, 1, `{}`)
		b.insert(t, good.ID, asset, 1, `{}`)
		cs, err := ds.Claim(ctx, ClaimParams{ClaimedBy: "t", Limit: 10, MaxInFlight: 10, Lease: time.Minute})
		if err != nil {
			t.Fatalf("%s: one subscription's bad secret failed the whole claim: %v", asset, err)
		}
		out := map[string]Claim{}
		for _, c := range cs {
			out[c.SubscriptionID] = c
		}
		if len(out) != 2 {
			t.Fatalf("%s: claimed %d, want both subscriptions' deliveries", asset, len(cs))
		}
		return out
	}
	check := func(name string, ds *DeliveryStore, wantErr error, wantText string) {
		t.Helper()
		c := claimBoth(name, ds)[bad.ID]
		if !errors.Is(c.SecretsErr, wantErr) || !strings.Contains(c.SecretsErr.Error(), wantText) ||
			!strings.Contains(c.SecretsErr.Error(), bad.ID) || c.Secrets != nil {
			t.Fatalf("%s: SecretsErr %v (secrets %q), want %v naming %s and the subscription", name, c.SecretsErr, c.Secrets, wantErr, wantText)
		}
	}

	// The key is not in the ring at all (nor is there a ring).
	check("missing key", NewDeliveryStore(b.pool).WithKeys(ring(t, "k9:"+matB)), keyring.ErrMissingKey, `"k1"`)
	check("no ring", NewDeliveryStore(b.pool), keyring.ErrMissingKey, `"k1"`)
	// Right id, wrong material.
	check("wrong material", NewDeliveryStore(b.pool).WithKeys(ring(t, "k1:"+matB)), keyring.ErrNotAuthentic, `"k1"`)

	ds := NewDeliveryStore(b.pool).WithKeys(sealing)
	// Tampered: one character of the ciphertext changed in the database.
	orig := b.rawSecrets(t, bad.ID)[0]
	tampered := []byte(orig)
	i := len(tampered) - 6
	tampered[i] = map[bool]byte{true: 'B', false: 'A'}[tampered[i] == 'A']
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.subscription_secrets SET secret = $2 WHERE subscription_id = $1`, bad.ID, string(tampered)); err != nil {
		t.Fatal(err)
	}
	got := claimBoth("tampered", ds)
	if !errors.Is(got[bad.ID].SecretsErr, keyring.ErrNotAuthentic) {
		t.Fatalf("tampered: SecretsErr %v", got[bad.ID].SecretsErr)
	}
	if g := got[good.ID]; g.SecretsErr != nil || len(g.Secrets) != 1 || g.Secrets[0] != good.Secret {
		t.Fatalf("the good subscription's claim: secrets %q, err %v", g.Secrets, g.SecretsErr)
	}
	// Moved: the good subscription's sealed secret copied onto the bad one's
	// row (to make the bad endpoint receive requests signed for the good one).
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.subscription_secrets SET secret = $2 WHERE subscription_id = $1`, bad.ID, b.rawSecrets(t, good.ID)[0]); err != nil {
		t.Fatal(err)
	}
	got = claimBoth("moved", ds)
	if c := got[bad.ID]; !errors.Is(c.SecretsErr, keyring.ErrNotAuthentic) || c.Secrets != nil {
		t.Fatalf("moved: secrets %q, err %v: a ciphertext opened on another subscription's row", c.Secrets, c.SecretsErr)
	}
}

// rotate-key seals plain-text secrets and those under older keys under the
// current key in bounded batches, changes no secret's value, reports what it
// did, and a second run has nothing to do.
func TestRotateKeysReseals(t *testing.T) {
	b, ctx := setup(t)
	old := ring(t, "k1:"+matA)
	want := map[string]string{} // subscription → secret
	for i := range 5 {
		switch {
		case i < 2:
			b.subs.WithKeys(nil) // written before the ring existed
		default:
			b.subs.WithKeys(old)
		}
		s := b.createSub(t, fmt.Sprintf("https://s%d.example/hook", i))
		want[s.ID] = s.Secret
	}
	kc, err := CheckKeys(ctx, b.pool, old)
	if err != nil || kc.Plaintext != 2 {
		t.Fatalf("CheckKeys = %+v, %v; want 2 plain text", kc, err)
	}
	// The new key first, the old one still there to decrypt.
	keys := ring(t, "k2:"+matB, "k1:"+matA)
	var progress []int
	rep, err := RotateKeys(ctx, b.pool, keys, 2, func(r RotateReport) { progress = append(progress, r.Resealed) })
	if err != nil {
		t.Fatal(err)
	}
	if rep.KeyID != "k2" || rep.Resealed != 5 || rep.FromPlaintext != 2 || rep.FromKeys["k1"] != 3 || rep.Batches != 3 || rep.Remaining != 0 || rep.Changed != 0 {
		t.Fatalf("report %+v, want 5 resealed (2 from plain text, 3 from k1) in 3 batches of at most 2", rep)
	}
	if fmt.Sprint(progress) != "[2 4 5]" {
		t.Errorf("progress %v, want [2 4 5]", progress)
	}
	// Every row under k2, opening to the same secret; k1 can now go.
	onlyNew := ring(t, "k2:"+matB)
	for sub, secret := range want {
		raw := b.rawSecrets(t, sub)
		if len(raw) != 1 || !strings.HasPrefix(raw[0], "enc:v1:k2:") {
			t.Fatalf("subscription %s stores %q", sub, raw)
		}
		got, err := openSecrets(onlyNew, sub, raw)
		if err != nil || got[0] != secret {
			t.Fatalf("subscription %s: opened %q, %v; want %q", sub, got, err, secret)
		}
	}
	if kc, err := CheckKeys(ctx, b.pool, onlyNew); err != nil || kc.Plaintext != 0 || len(kc.Keys) != 1 || kc.Keys[0].Secrets != 5 {
		t.Fatalf("CheckKeys after rotation = %+v, %v", kc, err)
	}
	// Idempotent.
	rep, err = RotateKeys(ctx, b.pool, keys, 2, nil)
	if err != nil || rep.Resealed != 0 || rep.Batches != 0 || rep.Remaining != 0 {
		t.Fatalf("second run: %+v, %v; want nothing to do", rep, err)
	}
	// Start-up's check names a key it does not hold, and wrong material.
	if _, err := CheckKeys(ctx, b.pool, ring(t, "k1:"+matA)); !errors.Is(err, keyring.ErrMissingKey) || !strings.Contains(err.Error(), `"k2"`) || !strings.Contains(err.Error(), "5 stored") {
		t.Fatalf("CheckKeys without k2 = %v", err)
	}
	if _, err := CheckKeys(ctx, b.pool, ring(t, "k2:"+matA)); !errors.Is(err, keyring.ErrNotAuthentic) || !strings.Contains(err.Error(), `"k2"`) {
		t.Fatalf("CheckKeys with the wrong k2 = %v", err)
	}
	// A row sealed under a key the ring lacks stops rotate-key, naming it,
	// before it changes anything it cannot read.
	if _, err := RotateKeys(ctx, b.pool, ring(t, "k3:"+matA), 10, nil); !errors.Is(err, keyring.ErrMissingKey) || !strings.Contains(err.Error(), `"k2"`) {
		t.Fatalf("RotateKeys without the key in use = %v", err)
	}
	if raw := b.rawSecrets(t, b.createSub(t, "https://x.example/").ID); len(raw) != 1 {
		t.Fatal(raw)
	}
}

// rotate-key racing secret rotations and claims: no secret is lost or
// changed, each claim signs with secrets that open, and at the end every
// secret is under the current key.
func TestRotateKeysUnderConcurrentRotations(t *testing.T) {
	b, ctx := setup(t)
	k1 := ring(t, "k1:"+matA)
	both := ring(t, "k2:"+matB, "k1:"+matA)
	back := ring(t, "k1:"+matA, "k2:"+matB)
	b.subs.WithKeys(k1)
	var subs []*Subscription
	for i := range 20 {
		subs = append(subs, b.createSub(t, fmt.Sprintf("https://s%d.example/hook", i)))
	}
	// Secret rotations write under k1 or k2 (replicas on old and new rings).
	rotating := NewSubscriptionStore(b.pool, true, time.Hour).WithKeys(both)
	var mu sync.Mutex
	latest := map[string]string{}
	for _, s := range subs {
		latest[s.ID] = s.Secret
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var rotations, claims atomic.Int64
	fail := make(chan error, 10)
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			s := subs[i%len(subs)]
			r, err := rotating.RotateSecret(ctx, s.ID)
			if err != nil {
				fail <- err
				return
			}
			mu.Lock()
			latest[s.ID] = r.Secret
			mu.Unlock()
			rotations.Add(1)
		}
	}()
	go func() {
		defer wg.Done()
		ds := NewDeliveryStore(b.pool).WithKeys(both)
		for {
			select {
			case <-stop:
				return
			default:
			}
			rows, err := b.pool.Query(ctx, `SELECT s.id::text, ARRAY(SELECT k.secret FROM bridge.subscription_secrets k
			  WHERE k.subscription_id = s.id AND (k.expires_at IS NULL OR k.expires_at > now()) ORDER BY k.id DESC) FROM bridge.subscriptions s`)
			if err != nil {
				fail <- err
				return
			}
			for rows.Next() {
				var sub string
				var stored []string
				if err := rows.Scan(&sub, &stored); err != nil {
					fail <- err
					return
				}
				if _, err := openSecrets(ds.keys, sub, stored); err != nil {
					fail <- fmt.Errorf("a secret did not open during rotation: %w", err)
					return
				}
			}
			rows.Close()
			claims.Add(1)
		}
	}()
	// Rotate the key back and forth while they run.
	passes := 0
	for range 6 {
		for _, r := range []*keyring.Ring{both, back} {
			if _, err := RotateKeys(ctx, b.pool, r, 3, nil); err != nil {
				t.Fatal(err)
			}
			passes++
		}
	}
	close(stop)
	wg.Wait()
	close(fail)
	for err := range fail {
		t.Fatal(err)
	}
	rep, err := RotateKeys(ctx, b.pool, both, 3, nil)
	if err != nil || rep.Remaining != 0 {
		t.Fatalf("final pass: %+v, %v", rep, err)
	}
	t.Logf("%d key passes, %d secret rotations, %d reads of every subscription's secrets meanwhile", passes+1, rotations.Load(), claims.Load())
	// Nothing lost: each subscription's newest secret is the last one
	// rotation returned, and it is under k2.
	for _, s := range subs {
		raw := b.rawSecrets(t, s.ID)
		newest := raw[len(raw)-1]
		got, err := openSecrets(ring(t, "k2:"+matB), s.ID, []string{newest})
		if err != nil || got[0] != latest[s.ID] {
			t.Fatalf("subscription %s: newest secret %q, %v; want %q", s.ID, got, err, latest[s.ID])
		}
	}
}
