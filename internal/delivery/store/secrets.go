package store

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/database/statement"
	"github.com/outboxbridge/bridge/internal/keyring"
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

// writeSecret stores a subscription's new secret, sealed under the ring's
// current key and bound to the subscription (keyring.Seal), so the column
// never holds it in plain text. A nil ring stores it in plain text: only
// with BRIDGE_ALLOW_PLAINTEXT_SECRETS=true, which start-up checks.
func writeSecret(ctx context.Context, q Querier, keys *keyring.Ring, subscriptionID, secret string) error {
	stored := secret
	if keys != nil {
		stored = keys.Seal(secret, subscriptionID)
	}
	_, err := q.Exec(ctx, insertSecretSQL, subscriptionID, stored)
	return err
}

// openSecrets turns stored secrets (as the claim returns them) into the
// secrets that sign. A plain-text value is one written before the ring
// existed (or with BRIDGE_ALLOW_PLAINTEXT_SECRETS): it signs as it is until
// `bridge secrets rotate-key` seals it. A sealed value the ring cannot open
// is an error naming the key id: signing with the other secrets alone would
// be rejected by a receiver that holds only that one.
func openSecrets(keys *keyring.Ring, subscriptionID string, stored []string) ([]string, error) {
	out := make([]string, len(stored))
	for i, v := range stored {
		if !keyring.IsSealed(v) {
			out[i] = v
			continue
		}
		plain, err := keys.Open(v, subscriptionID)
		if err != nil {
			return nil, fmt.Errorf("signing secret of subscription %s %w", subscriptionID, err)
		}
		out[i] = plain
	}
	return out, nil
}

// rotateSecret drops secrets past their grace, gives the current one grace
// to live and writes the new one.
func rotateSecret(ctx context.Context, q Querier, keys *keyring.Ring, subscriptionID, secret string, grace time.Duration) error {
	if _, err := q.Exec(ctx, pruneExpiredSecretsSQL, subscriptionID); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, expireCurrentSecretsSQL, subscriptionID, grace); err != nil {
		return err
	}
	return writeSecret(ctx, q, keys, subscriptionID, secret)
}

func listSecrets(ctx context.Context, q Querier, subscriptionID string) ([]SecretInfo, error) {
	return statement.Select[SecretInfo](ctx, q, "list secrets", listSecretsSQL, subscriptionID)
}

// Key rotation ---------------------------------------------------------------

// secretKeyIDExpr is the id of the key a stored secret (column secret) is
// sealed under, empty for plain text; $1 is keyring.SealedPrefix(""), after which
// the id runs to the next ':' (keyring's format, stated there).
const secretKeyIDExpr = `CASE WHEN left(secret, length($1)) = $1
  THEN split_part(substr(secret, length($1) + 1), ':', 1) ELSE '' END`

// secretKeysSQL is, per key id (empty for plain text), how many secrets it seals
// and its oldest one, which start-up opens to prove the ring's key of that id
// is the right one. One pass over a table of one row per secret.
const secretKeysSQL = `
SELECT DISTINCT ON (key_id) key_id, count(*) OVER (PARTITION BY key_id) AS secrets, subscription_id, secret
FROM (SELECT id, subscription_id::text AS subscription_id, secret, ` + secretKeyIDExpr + ` AS key_id
      FROM bridge.subscription_secrets) k
ORDER BY key_id, id`

// secretsToResealSQL is the next batch of secrets not sealed under the
// current key, after id $2 and up to id $4, the last secret when the run
// began: a process still on an older ring keeps writing secrets under its
// key, and chasing them would never end (they are reported as remaining).
// The prefix comparison is exact (not LIKE: '_' in a key id would be a
// wildcard). Each statement sees rows sealed meanwhile as current, so a
// second run, or a resumed one, skips them.
const secretsToResealSQL = `
SELECT id, subscription_id::text, secret FROM bridge.subscription_secrets
WHERE id > $2 AND id <= $4 AND left(secret, length($1)) <> $1
ORDER BY id LIMIT $3`

const lastSecretIDSQL = `SELECT coalesce(max(id), 0) FROM bridge.subscription_secrets`

// resealSecretSQL replaces a secret only if it is still the value read: a
// concurrent rotate-key or secret rotation that changed or deleted it wins,
// and nothing it wrote is overwritten with an older value.
const resealSecretSQL = `UPDATE bridge.subscription_secrets SET secret = $3 WHERE id = $1 AND secret = $2`

// KeyUse is how many stored signing secrets one key seals.
type KeyUse struct {
	// KeyID is "" for secrets stored in plain text.
	KeyID   string `json:"key_id"`
	Secrets int64  `json:"secrets"`
	// sample is the oldest of them, for CheckKeys to open.
	sampleSub, sample string
}

// SecretKeys counts the stored signing secrets per key id (plain text as
// ""), in key id order.
func SecretKeys(ctx context.Context, q Querier) ([]KeyUse, error) {
	rows, err := q.Query(ctx, secretKeysSQL, keyring.SealedPrefix(""))
	if err != nil {
		return nil, fmt.Errorf("count secrets per key: %w", err)
	}
	var out []KeyUse
	var u KeyUse
	_, err = pgx.ForEachRow(rows, []any{&u.KeyID, &u.Secrets, &u.sampleSub, &u.sample}, func() error {
		out = append(out, u)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count secrets per key: %w", err)
	}
	return out, nil
}

// KeyCheck is what CheckKeys found: the secrets per key, and how many are
// still plain text (rotate-key seals them).
type KeyCheck struct {
	Keys      []KeyUse
	Plaintext int64
}

// CheckKeys proves keys opens every stored secret: each key id in use must
// be in the ring, and its oldest secret must open under it (the right key
// material, not only the right id). The error names the key id and how many
// secrets it seals. keys nil (plain text allowed) only counts.
func CheckKeys(ctx context.Context, q Querier, keys *keyring.Ring) (KeyCheck, error) {
	uses, err := SecretKeys(ctx, q)
	if err != nil {
		return KeyCheck{}, err
	}
	kc := KeyCheck{Keys: uses}
	for _, u := range uses {
		if u.KeyID == "" {
			kc.Plaintext = u.Secrets
			continue
		}
		if _, err := keys.Open(u.sample, u.sampleSub); err != nil {
			return kc, fmt.Errorf("%d stored signing secret(s) cannot be opened: the oldest (subscription %s) %w", u.Secrets, u.sampleSub, err)
		}
	}
	return kc, nil
}

// RotateReport is what RotateKeys did.
type RotateReport struct {
	// KeyID is the current key, the one everything is now sealed under.
	KeyID string `json:"key_id"`
	// Resealed counts the secrets sealed under KeyID by this run;
	// FromPlaintext and FromKeys say what they were before.
	Resealed      int            `json:"resealed"`
	FromPlaintext int            `json:"from_plaintext"`
	FromKeys      map[string]int `json:"from_keys"`
	// Changed counts secrets that changed or were deleted between being read
	// and being resealed (a concurrent rotation): left as the other wrote them.
	Changed int `json:"changed"`
	// Batches is how many transactions it took.
	Batches int `json:"batches"`
	// Remaining counts secrets still not under KeyID when it finished
	// (written meanwhile by a process with an older ring); 0 means done.
	Remaining int64 `json:"remaining"`
}

// RotateKeys re-encrypts every stored signing secret that is not sealed
// under the ring's current key — plain-text ones included — in transactions
// of at most batch secrets, so it holds no lock for long and a large table
// does not become one huge transaction. It is idempotent and resumable:
// what is already under the current key is skipped, so an interrupted run is
// finished by running it again. Deliveries keep verifying throughout: a
// secret's value (what signs) never changes, only how it is stored, and each
// row is replaced in one statement. progress (may be nil) is called after
// each batch.
func RotateKeys(ctx context.Context, db DB, keys *keyring.Ring, batch int, progress func(RotateReport)) (RotateReport, error) {
	rep := RotateReport{KeyID: keys.CurrentID(), FromKeys: map[string]int{}}
	if batch < 1 {
		return rep, fmt.Errorf("rotate keys: batch must be at least 1, not %d", batch)
	}
	current := keyring.SealedPrefix(keys.CurrentID())
	var after, last int64
	if err := db.QueryRow(ctx, lastSecretIDSQL).Scan(&last); err != nil {
		return rep, fmt.Errorf("rotate keys: %w", err)
	}
	for {
		type row struct {
			id          int64
			sub, secret string
		}
		var todo []row
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, secretsToResealSQL, current, after, batch, last)
			if err != nil {
				return err
			}
			var r row
			if _, err := pgx.ForEachRow(rows, []any{&r.id, &r.sub, &r.secret}, func() error {
				todo = append(todo, r)
				return nil
			}); err != nil {
				return err
			}
			if len(todo) == 0 {
				return nil
			}
			b := &pgx.Batch{}
			for _, r := range todo {
				plain := r.secret
				if keyring.IsSealed(r.secret) {
					if plain, err = keys.Open(r.secret, r.sub); err != nil {
						return fmt.Errorf("secret %d of subscription %s %w", r.id, r.sub, err)
					}
				}
				b.Queue(resealSecretSQL, r.id, r.secret, keys.Seal(plain, r.sub))
			}
			res := tx.SendBatch(ctx, b)
			for _, r := range todo {
				tag, err := res.Exec()
				if err != nil {
					res.Close()
					return err
				}
				if tag.RowsAffected() == 0 {
					rep.Changed++
					continue
				}
				rep.Resealed++
				if id, ok := keyring.KeyID(r.secret); ok {
					rep.FromKeys[id]++
				} else {
					rep.FromPlaintext++
				}
			}
			return res.Close()
		})
		if err != nil {
			return rep, fmt.Errorf("rotate keys: %w", err)
		}
		if len(todo) == 0 {
			break
		}
		rep.Batches++
		after = todo[len(todo)-1].id
		if progress != nil {
			progress(rep)
		}
	}
	uses, err := SecretKeys(ctx, db)
	if err != nil {
		return rep, err
	}
	for _, u := range uses {
		if u.KeyID != rep.KeyID {
			rep.Remaining += u.Secrets
		}
	}
	return rep, nil
}
