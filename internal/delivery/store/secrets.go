package store

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// bridge.subscription_secrets ----------------------------------------------------
//
// A secret is written by writeSecret and turned back into signing keys by
// openSecrets, and nowhere else: encryption at rest wraps those two.

const insertSecretSQL = `INSERT INTO bridge.subscription_secrets (subscription_id, secret) VALUES ($1, $2)`

// expireCurrentSecretsSQL starts the grace period of the secret being rotated
// out: until expires_at it keeps signing beside the new one, so a receiver can
// switch without rejecting a delivery.
const expireCurrentSecretsSQL = `
UPDATE bridge.subscription_secrets SET expires_at = now() + $2::interval
WHERE subscription_id = $1 AND expires_at IS NULL`

const pruneExpiredSecretsSQL = `
DELETE FROM bridge.subscription_secrets WHERE subscription_id = $1 AND expires_at <= now()`

// listSecretsSQL returns secret metadata, never the secret itself.
const listSecretsSQL = `
SELECT id, created_at, expires_at FROM bridge.subscription_secrets
WHERE subscription_id = $1 AND (expires_at IS NULL OR expires_at > now())
ORDER BY id`

// validSecretsExpr is the secrets that sign a request now, newest first, for
// the subscription of the row aliased c: the claim returns them with each
// delivery.
const validSecretsExpr = `ARRAY(SELECT k.secret FROM bridge.subscription_secrets k
             WHERE k.subscription_id = c.subscription_id AND (k.expires_at IS NULL OR k.expires_at > now())
             ORDER BY k.id DESC)`

// SecretPrefix marks a Standard Webhooks signing secret.
const SecretPrefix = "whsec_"

// secretBytes is the key length: 32 random bytes (the contract asks for at
// least 24; HMAC-SHA256's block gains nothing beyond 64).
const secretBytes = 32

// NewSecret returns a fresh signing secret, "whsec_" + base64(32 random bytes).
func NewSecret() string {
	b := make([]byte, secretBytes)
	// crypto/rand.Read never returns an error (Go 1.24+); it panics if the
	// system's source fails, which is the right outcome for key generation.
	_, _ = rand.Read(b)
	return SecretPrefix + base64.StdEncoding.EncodeToString(b)
}

// SecretInfo describes a valid signing secret without revealing it.
type SecretInfo struct {
	ID        int64      `json:"id" db:"id"`
	CreatedAt time.Time  `json:"created_at" db:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty" db:"expires_at"`
}

// writeSecret stores a subscription's new secret.
func writeSecret(ctx context.Context, q Querier, subscriptionID, secret string) error {
	_, err := q.Exec(ctx, insertSecretSQL, subscriptionID, secret)
	return err
}

// openSecrets turns stored secrets (as the claim returns them) into the
// secrets that sign.
func openSecrets(stored []string) ([]string, error) { return stored, nil }

// rotateSecret drops secrets past their grace, gives the current one grace
// to live and writes the new one.
func rotateSecret(ctx context.Context, q Querier, subscriptionID, secret string, grace time.Duration) error {
	if _, err := q.Exec(ctx, pruneExpiredSecretsSQL, subscriptionID); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, expireCurrentSecretsSQL, subscriptionID, grace); err != nil {
		return err
	}
	return writeSecret(ctx, q, subscriptionID, secret)
}

func listSecrets(ctx context.Context, q Querier, subscriptionID string) ([]SecretInfo, error) {
	rows, err := q.Query(ctx, listSecretsSQL, subscriptionID)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[SecretInfo])
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	return out, nil
}
