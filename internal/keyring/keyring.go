// Package keyring encrypts webhook signing secrets at rest: AES-256-GCM under
// a ring of keys read from BRIDGE_SECRET_KEYS. The first key of the ring
// encrypts; every key decrypts, so a key is rotated by putting a new one in
// front, re-encrypting (`bridge secrets rotate-key`), and only then dropping
// the old one.
//
// Without it, anyone who can read the database, a replica or a backup holds
// every subscriber's signing secret and can forge webhooks to all of them.
//
// A sealed secret is one text value, self-describing, so the column keeps its
// type and a row says which key opens it:
//
//	enc:v1:<key id>:<base64(nonce ‖ ciphertext ‖ tag)>
//
// The nonce is 12 random bytes per seal. The additional data authenticated
// with the ciphertext is the format version, the key id and the caller's
// context (the subscription id): a ciphertext copied onto another
// subscription's row, or relabelled with another key id, fails to open
// instead of signing for the wrong endpoint.
//
// Key material never appears in an error, a log line or `bridge config`:
// only key ids do.
package keyring

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// Var is the environment variable holding the ring.
const Var = "BRIDGE_SECRET_KEYS"

// Format says what Var holds, for errors, `bridge config` and the docs.
const Format = "<id>:<base64 of 32 random bytes>[,<id>:<key>...], the first encrypts; " +
	"make a key with: openssl rand -base64 32"

// KeyBytes is an AES-256 key's length.
const KeyBytes = 32

// maxIDLen bounds a key id; it is stored in every sealed secret.
const maxIDLen = 32

// prefix starts every sealed secret (version 1 of the format).
const prefix = "enc:v1:"

// DevKeyID and DevKeys are the published development ring that `bridge demo`
// and the compose file use. Anyone can decrypt secrets sealed under it:
// start-up warns whenever a ring holds it.
const (
	DevKeyID = "dev-not-secret"
	DevKeys  = DevKeyID + ":ZGV2LW9ubHkta2V5LWRvLW5vdC11c2UtaW4tcHJvZCE="
)

// devKeyMaterial is DevKeys' key, to recognise it under any id.
const devKeyMaterial = "dev-only-key-do-not-use-in-prod!"

type key struct {
	id   string
	aead cipher.AEAD
	dev  bool
}

// Ring is a parsed BRIDGE_SECRET_KEYS: at least one key.
type Ring struct{ keys []key }

// ParseError says what is wrong with one item of the ring. It names the item
// by position and id, never by its key material.
type ParseError struct {
	Item    int    // 1-based
	ID      string // "" when the id itself is what is wrong
	Problem string
}

func (e *ParseError) Error() string {
	if e.ID == "" {
		return fmt.Sprintf("key %d: %s", e.Item, e.Problem)
	}
	return fmt.Sprintf("key %d (%q): %s", e.Item, e.ID, e.Problem)
}

// Parse reads a ring from its items (Var split on commas, spaces trimmed).
// No items is a nil ring and no error: the caller decides whether a ring is
// required.
func Parse(items []string) (*Ring, error) {
	if len(items) == 0 {
		return nil, nil
	}
	r := &Ring{}
	seen := map[string]bool{}
	for i, item := range items {
		n := i + 1
		id, material, ok := strings.Cut(strings.TrimSpace(item), ":")
		if !ok {
			return nil, &ParseError{Item: n, Problem: "is not <id>:<base64 key>"}
		}
		if p := idProblem(id); p != "" {
			return nil, &ParseError{Item: n, Problem: p}
		}
		if seen[id] {
			return nil, &ParseError{Item: n, ID: id, Problem: "appears twice (each key id names one key)"}
		}
		seen[id] = true
		raw, err := base64.StdEncoding.DecodeString(material)
		if err != nil {
			return nil, &ParseError{Item: n, ID: id, Problem: "key is not standard base64"}
		}
		if len(raw) != KeyBytes {
			return nil, &ParseError{Item: n, ID: id, Problem: fmt.Sprintf("key is %d bytes, must be %d (AES-256)", len(raw), KeyBytes)}
		}
		block, err := aes.NewCipher(raw)
		if err != nil {
			return nil, &ParseError{Item: n, ID: id, Problem: err.Error()}
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, &ParseError{Item: n, ID: id, Problem: err.Error()}
		}
		r.keys = append(r.keys, key{id: id, aead: aead, dev: string(raw) == devKeyMaterial})
	}
	return r, nil
}

// idProblem says what is wrong with a key id, "" when nothing.
func idProblem(id string) string {
	switch {
	case id == "":
		return "key id is empty"
	case len(id) > maxIDLen:
		return fmt.Sprintf("key id is longer than %d characters", maxIDLen)
	}
	for _, c := range id {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
		if !ok {
			return fmt.Sprintf("key id %q may hold only letters, digits, '-', '_' and '.'", id)
		}
	}
	return ""
}

// CurrentID is the id of the key that encrypts.
func (r *Ring) CurrentID() string { return r.keys[0].id }

// IDs lists the ring's key ids in order, the encrypting one first.
func (r *Ring) IDs() []string {
	out := make([]string, len(r.keys))
	for i, k := range r.keys {
		out[i] = k.id
	}
	return out
}

// Has reports whether the ring holds key id.
func (r *Ring) Has(id string) bool { return r.find(id) != nil }

// DevKeyIDs lists the ids of the ring's keys that are the published
// development key: secrets under them are as good as plain text.
func (r *Ring) DevKeyIDs() []string {
	var out []string
	for _, k := range r.keys {
		if k.dev {
			out = append(out, k.id)
		}
	}
	return out
}

// Describe is the ring without its material, for `bridge config`:
// "k2 (encrypts), k1".
func (r *Ring) Describe() string {
	if r == nil {
		return ""
	}
	ids := r.IDs()
	ids[0] += " (encrypts)"
	return strings.Join(ids, ", ")
}

func (r *Ring) find(id string) *key {
	for i := range r.keys {
		if r.keys[i].id == id {
			return &r.keys[i]
		}
	}
	return nil
}

func additionalData(id, context string) []byte {
	return []byte(prefix + id + ":" + context)
}

// Seal encrypts plaintext under the current key, bound to context (the
// subscription id): only Open with the same context returns it.
func (r *Ring) Seal(plaintext, context string) string {
	k := r.keys[0]
	nonce := make([]byte, k.aead.NonceSize())
	// crypto/rand.Read never returns an error (Go 1.24+); it panics if the
	// system's source fails, the right outcome for a nonce.
	_, _ = rand.Read(nonce)
	sealed := k.aead.Seal(nonce, nonce, []byte(plaintext), additionalData(k.id, context))
	return prefix + k.id + ":" + base64.StdEncoding.EncodeToString(sealed)
}

// KeyID returns the id of the key a stored value is sealed under; ok is false
// for a value that is not sealed (plain text).
func KeyID(stored string) (id string, ok bool) {
	rest, ok := strings.CutPrefix(stored, prefix)
	if !ok {
		return "", false
	}
	id, _, _ = strings.Cut(rest, ":")
	return id, true
}

// SealedPrefix starts every value sealed under key id; SealedPrefix("")
// starts every sealed value, and the key id runs from there to the next ':'
// (the store's SQL finds key ids that way).
func SealedPrefix(id string) string {
	if id == "" {
		return prefix
	}
	return prefix + id + ":"
}

// IsSealed reports whether a stored value is sealed (not plain text).
func IsSealed(stored string) bool { return strings.HasPrefix(stored, prefix) }

// ErrMissingKey: the value is sealed under a key the ring does not hold (or
// there is no ring). errors.As with *KeyError gives the key id.
var ErrMissingKey = errors.New("key not in " + Var)

// ErrNotAuthentic: the value does not open under the key its id names —
// tampered with, copied from another row, or the ring's key of that id is
// not the one it was sealed with.
var ErrNotAuthentic = errors.New("does not authenticate")

// KeyError is an Open failure naming the key id.
type KeyError struct {
	KeyID string
	Err   error // ErrMissingKey, ErrNotAuthentic or a malformed value
}

func (e *KeyError) Error() string {
	switch {
	case errors.Is(e.Err, ErrMissingKey):
		return fmt.Sprintf("sealed under key %q, which %s does not hold", e.KeyID, Var)
	case errors.Is(e.Err, ErrNotAuthentic):
		return fmt.Sprintf("does not open under key %q: tampered with, moved from another row, or %s holds different material under that id", e.KeyID, Var)
	}
	return fmt.Sprintf("sealed under key %q: %v", e.KeyID, e.Err)
}

func (e *KeyError) Unwrap() error { return e.Err }

// Open decrypts a sealed value bound to context. A nil ring opens nothing
// (ErrMissingKey). Callers check IsSealed first: Open refuses plain text.
func (r *Ring) Open(stored, context string) (string, error) {
	rest, ok := strings.CutPrefix(stored, prefix)
	if !ok {
		return "", errors.New("value is not sealed")
	}
	id, body, ok := strings.Cut(rest, ":")
	if !ok {
		return "", &KeyError{KeyID: id, Err: errors.New("malformed sealed value")}
	}
	var k *key
	if r != nil {
		k = r.find(id)
	}
	if k == nil {
		return "", &KeyError{KeyID: id, Err: ErrMissingKey}
	}
	raw, err := base64.StdEncoding.DecodeString(body)
	if err != nil || len(raw) < k.aead.NonceSize()+k.aead.Overhead() {
		return "", &KeyError{KeyID: id, Err: fmt.Errorf("%w (malformed sealed value)", ErrNotAuthentic)}
	}
	n := k.aead.NonceSize()
	plain, err := k.aead.Open(nil, raw[:n], raw[n:], additionalData(id, context))
	if err != nil {
		return "", &KeyError{KeyID: id, Err: ErrNotAuthentic}
	}
	return string(plain), nil
}

// Current reports whether a stored value is sealed under the current key
// (rotate-key leaves it alone).
func (r *Ring) Current(stored string) bool {
	id, ok := KeyID(stored)
	return ok && id == r.CurrentID()
}
