package webhooktest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"sync"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// verifier checks Standard Webhooks signatures with one secret: the
// reference library's algorithm and errors (standardwebhooks.Webhook.Verify:
// required headers, a timestamp within 5 minutes either way, any "v1,"
// signature of id.timestamp.body matching), with the secret's HMAC made
// once and reused, and the body hashed where it lies. The library builds a
// new HMAC and a copy of the body per request, which made the receiver a
// large share of what a benchmark measured on the same machine;
// TestVerifierAgreesWithTheReference holds the two to the same answers.
type verifier struct {
	macs sync.Pool
}

// signatureTolerance is the reference library's.
const signatureTolerance = 5 * time.Minute

func newVerifier(secret string) (*verifier, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return nil, fmt.Errorf("unable to create webhook, err: %w", err)
	}
	return &verifier{macs: sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}, nil
}

// Verify checks body against the request's webhook-id, webhook-timestamp
// and webhook-signature header values ("" when a header is missing), as the
// reference library's Verify does with the headers.
func (v *verifier) Verify(body []byte, id, ts, sigs string, now time.Time) error {
	if id == "" || sigs == "" || ts == "" {
		return fmt.Errorf("unable to verify payload, err: %w", standardwebhooks.ErrRequiredHeaders)
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("unable to verify payload, err: unable to parse timestamp header, err: %w",
			fmt.Errorf("%w\n%w", err, standardwebhooks.ErrInvalidHeaders))
	}
	at := time.Unix(secs, 0)
	switch {
	case now.Sub(at) > signatureTolerance:
		return fmt.Errorf("unable to verify payload, err: %w", standardwebhooks.ErrMessageTooOld)
	case at.After(now.Add(signatureTolerance)):
		return fmt.Errorf("unable to verify payload, err: %w", standardwebhooks.ErrMessageTooNew)
	}
	mac := v.macs.Get().(hash.Hash)
	mac.Reset()
	// id, '.', the timestamp as the library formats it, '.', in one write.
	var buf [64]byte
	head := append(buf[:0], id...)
	head = append(head, '.')
	head = strconv.AppendInt(head, secs, 10)
	head = append(head, '.')
	mac.Write(head)
	mac.Write(body)
	var sum [sha256.Size]byte
	var enc [44]byte // base64 of 32 bytes
	base64.StdEncoding.Encode(enc[:], mac.Sum(sum[:0]))
	v.macs.Put(mac)
	// The reference splits the header on ' ' and each part on ',': a part
	// counts when its first field is "v1" and its second matches.
	for rest := sigs; ; {
		part, more, found := strings.Cut(rest, " ")
		if ver, sig, ok := strings.Cut(part, ","); ok && ver == "v1" {
			sig, _, _ = strings.Cut(sig, ",")
			if hmac.Equal([]byte(sig), enc[:]) {
				return nil
			}
		}
		if !found {
			break
		}
		rest = more
	}
	return fmt.Errorf("unable to verify payload, err: %w", standardwebhooks.ErrNoMatchingSignature)
}
