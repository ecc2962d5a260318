package delivery

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"

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

// Sign returns the webhook-signature header value: one "v1,<base64
// HMAC-SHA256 of id.timestamp.body>" per secret, space-separated. During a
// rotation both the new and the previous secret sign, so a receiver verifies
// with whichever it has.
func Sign(secrets []string, msgID string, timestamp int64, body []byte) (string, error) {
	sigs := make([]string, 0, len(secrets))
	ts := strconv.FormatInt(timestamp, 10)
	for _, s := range secrets {
		key, err := secretKey(s)
		if err != nil {
			return "", err
		}
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(msgID))
		mac.Write([]byte{'.'})
		mac.Write([]byte(ts))
		mac.Write([]byte{'.'})
		mac.Write(body)
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	}
	return strings.Join(sigs, " "), nil
}
