package delivery

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"sync"

	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// secretKey returns the HMAC key of a "whsec_" secret.
func secretKey(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, store.SecretPrefix))
	if err != nil {
		return nil, fmt.Errorf("decode signing secret: %w", err)
	}
	return key, nil
}

// signer is one secret's HMAC-SHA256, made once: decoding the secret and
// building the HMAC's two hashes and pads per request was most of the
// signature's cost and allocations. Each request takes a MAC from the pool
// and resets it.
type signer struct{ pool sync.Pool }

// pooledMAC is a signer's MAC and the buffer "id.timestamp." is written
// from: bytes handed to the MAC's Write (an interface) escape, so a buffer
// on the stack or a []byte(id) conversion was an allocation per request.
type pooledMAC struct {
	mac  hash.Hash
	head []byte
}

// signers maps a secret to its signer. It holds at most maxSigners (a
// process signs for its subscriptions' current and previous secrets); past
// that it starts again empty, so rotated-away secrets do not accumulate.
var signers struct {
	sync.Mutex
	m map[string]*signer
}

const maxSigners = 4096

func signerOf(secret string) (*signer, error) {
	signers.Lock()
	s := signers.m[secret]
	signers.Unlock()
	if s != nil {
		return s, nil
	}
	key, err := secretKey(secret)
	if err != nil {
		return nil, err
	}
	s = &signer{pool: sync.Pool{New: func() any { return &pooledMAC{mac: hmac.New(sha256.New, key)} }}}
	signers.Lock()
	if signers.m == nil || len(signers.m) >= maxSigners {
		signers.m = map[string]*signer{}
	}
	signers.m[secret] = s
	signers.Unlock()
	return s, nil
}

// Sign returns the webhook-signature header value: one "v1,<base64
// HMAC-SHA256 of id.timestamp.body>" per secret, space-separated. During a
// rotation both the new and the previous secret sign, so a receiver verifies
// with whichever it has.
func Sign(secrets []string, msgID string, timestamp int64, body []byte) (string, error) {
	var tsBuf [20]byte
	ts := strconv.AppendInt(tsBuf[:0], timestamp, 10)
	// The header is built in its string's own buffer (strings.Builder):
	// one allocation per request.
	var out strings.Builder
	out.Grow(len(secrets) * 48)
	var enc [44]byte // base64 of 32 bytes
	for i, secret := range secrets {
		s, err := signerOf(secret)
		if err != nil {
			return "", err
		}
		pm := s.pool.Get().(*pooledMAC)
		mac := pm.mac
		mac.Reset()
		pm.head = append(append(append(append(pm.head[:0], msgID...), '.'), ts...), '.')
		mac.Write(pm.head)
		mac.Write(body)
		var sum [sha256.Size]byte
		if i > 0 {
			out.WriteByte(' ')
		}
		out.WriteString("v1,")
		base64.StdEncoding.Encode(enc[:], mac.Sum(sum[:0]))
		out.Write(enc[:])
		s.pool.Put(pm)
	}
	return out.String(), nil
}
