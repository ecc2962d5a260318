package keyring

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

const (
	matA = "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=" // 32 × 'A'
	matB = "QkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkI=" // 32 × 'B'
)

func mustParse(t *testing.T, items ...string) *Ring {
	t.Helper()
	r, err := Parse(items)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestSealOpenRoundTripBoundToContext(t *testing.T) {
	r := mustParse(t, "k2:"+matB, "k1:"+matA)
	const secret = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlYw=="
	a, b := r.Seal(secret, "sub-1"), r.Seal(secret, "sub-1")
	if a == b {
		t.Fatal("two seals of one secret are equal: the nonce is not random")
	}
	if strings.Contains(a, "whsec_") || strings.Contains(a, secret[6:]) {
		t.Fatalf("sealed value %q shows the secret", a)
	}
	if id, ok := KeyID(a); !ok || id != "k2" || !r.Current(a) {
		t.Fatalf("KeyID(%q) = %q, %v; want the first key, k2", a, id, ok)
	}
	got, err := r.Open(a, "sub-1")
	if err != nil || got != secret {
		t.Fatalf("Open = %q, %v", got, err)
	}
	// Another row's context: refused, naming the key.
	_, err = r.Open(a, "sub-2")
	var ke *KeyError
	if !errors.As(err, &ke) || ke.KeyID != "k2" || !errors.Is(err, ErrNotAuthentic) {
		t.Fatalf("Open under another subscription = %v, want ErrNotAuthentic naming k2", err)
	}
	// The old key still opens what it sealed.
	old := mustParse(t, "k1:"+matA).Seal(secret, "sub-1")
	if got, err := r.Open(old, "sub-1"); err != nil || got != secret || r.Current(old) {
		t.Fatalf("Open(old) = %q, %v (current %v)", got, err, r.Current(old))
	}
}

func TestOpenRefusesTamperedRelabelledAndUnknown(t *testing.T) {
	r := mustParse(t, "k1:"+matA, "k2:"+matB)
	sealed := r.Seal("whsec_x", "sub")
	body := strings.TrimPrefix(sealed, "enc:v1:k1:")
	raw, _ := base64.StdEncoding.DecodeString(body)
	for i := range raw {
		flipped := append([]byte(nil), raw...)
		flipped[i] ^= 1
		_, err := r.Open("enc:v1:k1:"+base64.StdEncoding.EncodeToString(flipped), "sub")
		if !errors.Is(err, ErrNotAuthentic) {
			t.Fatalf("byte %d flipped: Open = %v, want ErrNotAuthentic", i, err)
		}
	}
	// Relabelled with the other key id: the id is authenticated too.
	if _, err := r.Open("enc:v1:k2:"+body, "sub"); !errors.Is(err, ErrNotAuthentic) {
		t.Fatalf("relabelled: %v", err)
	}
	for _, bad := range []string{"enc:v1:k1:", "enc:v1:k1:!!!", "enc:v1:k1"} {
		if _, err := r.Open(bad, "sub"); err == nil {
			t.Fatalf("Open(%q) succeeded", bad)
		}
	}
	// A key the ring does not hold, and no ring at all: the error names it.
	other := mustParse(t, "k9:"+matA).Seal("whsec_x", "sub")
	for _, ring := range []*Ring{r, nil} {
		_, err := ring.Open(other, "sub")
		if !errors.Is(err, ErrMissingKey) || !strings.Contains(err.Error(), `"k9"`) || !strings.Contains(err.Error(), Var) {
			t.Fatalf("Open under a missing key = %v, want ErrMissingKey naming k9 and %s", err, Var)
		}
	}
	// The wrong material under the right id.
	wrong := mustParse(t, "k1:"+matB)
	if _, err := wrong.Open(sealed, "sub"); !errors.Is(err, ErrNotAuthentic) || !strings.Contains(err.Error(), `"k1"`) {
		t.Fatalf("wrong material: %v", err)
	}
}

func TestParseNamesTheItemNeverTheKey(t *testing.T) {
	short := base64.StdEncoding.EncodeToString([]byte("too-short-key-material"))
	cases := []struct {
		items []string
		want  string
	}{
		{[]string{"k1" + matA}, "key 1: is not <id>:<base64 key>"},
		{[]string{":" + matA}, "key 1: key id is empty"},
		{[]string{"k 1:" + matA}, `may hold only`},
		{[]string{strings.Repeat("k", 33) + ":" + matA}, "longer than 32"},
		{[]string{"k1:" + matA, "k1:" + matB}, `key 2 ("k1"): appears twice`},
		{[]string{"k1:" + matA, "k2:not*base64"}, `key 2 ("k2"): key is not standard base64`},
		{[]string{"k1:" + short}, `key 1 ("k1"): key is 22 bytes, must be 32`},
	}
	for _, c := range cases {
		_, err := Parse(c.items)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want %q", c.items, err, c.want)
			continue
		}
		for _, it := range c.items {
			if _, m, ok := strings.Cut(it, ":"); ok && len(m) > 4 && strings.Contains(err.Error(), m) {
				t.Errorf("Parse error %q shows key material", err)
			}
		}
	}
	if r, err := Parse(nil); r != nil || err != nil {
		t.Fatalf("Parse(nil) = %v, %v", r, err)
	}
}

func TestDevKeyIsRecognised(t *testing.T) {
	r := mustParse(t, "prod:"+matA, DevKeys)
	if got := r.DevKeyIDs(); len(got) != 1 || got[0] != DevKeyID {
		t.Fatalf("DevKeyIDs = %v", got)
	}
	if got := r.Describe(); got != "prod (encrypts), "+DevKeyID {
		t.Fatalf("Describe = %q", got)
	}
}
