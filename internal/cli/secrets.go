package cli

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/keyring"
)

func init() { register(newSecretsCmd) }

// defaultRotateBatch bounds one rotate-key transaction: small enough that it
// holds its row locks for milliseconds, large enough that a table of a
// million secrets takes a few thousand round trips.
const defaultRotateBatch = 500

func newSecretsCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "secrets",
		GroupID: groupOperate,
		Short:   "Signing secrets at rest: which keys seal them, re-encrypt under the current key",
		Long: `Webhook signing secrets are stored encrypted (AES-256-GCM) under the key ring
BRIDGE_SECRET_KEYS: ` + keyring.Format + `.

To rotate the key: put a new key first in BRIDGE_SECRET_KEYS (keep the old one
after it) on every process, run 'bridge secrets rotate-key', check that
'bridge secrets status' shows only the new key, then drop the old one.
rotate-key also encrypts secrets stored in plain text (written before the
key ring was set, or with BRIDGE_ALLOW_PLAINTEXT_SECRETS=true).`,
		Example: `  BRIDGE_SECRET_KEYS="k2:$(openssl rand -base64 32),k1:…" bridge secrets rotate-key
  bridge secrets status -o json`,
	}
	c.AddCommand(newSecretsRotateKeyCmd(), newSecretsStatusCmd())
	return c
}

// requireRing is the key ring a secrets command works with: without one
// there is nothing to encrypt under.
func requireRing(cfg *config.Config, what string) (*keyring.Ring, error) {
	ring := cfg.Secrets.Ring()
	if ring == nil {
		return nil, &config.Error{Var: keyring.Var, Problem: "is required by " + what + ". Format: " + keyring.Format}
	}
	return ring, nil
}

func newSecretsRotateKeyCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "rotate-key [--batch N]",
		Short: "Re-encrypt every signing secret under the first key of BRIDGE_SECRET_KEYS (plain-text ones too)",
		Long: `Re-encrypts, in transactions of at most --batch secrets, every stored signing
secret not yet sealed under the current key (the first of BRIDGE_SECRET_KEYS),
plain-text ones included. What a secret signs with never changes, so
deliveries keep verifying throughout. Safe to run again or to interrupt: a
second run finishes what the first left. Exits 1 if secrets not under the
current key remain at the end (a process with an older BRIDGE_SECRET_KEYS
wrote them meanwhile: update it and run again).`,
		Example: `  bridge secrets rotate-key
  bridge secrets rotate-key --batch 100 -o json`,
		Args: cobra.NoArgs,
	}
	batch := c.Flags().Int("batch", defaultRotateBatch, "secrets re-encrypted per transaction")
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		if *batch < 1 || *batch > 100000 {
			return UsageErrorf("--batch must be between 1 and 100000, got %d", *batch)
		}
		cfg, err := loadConfig(config.Needs{Database: true})
		if err != nil {
			return err
		}
		ring, err := requireRing(cfg, "bridge secrets rotate-key")
		if err != nil {
			return err
		}
		return withDB(cmd.Context(), func(_ *config.Config, pool *pgxpool.Pool) error {
			progress := func(r store.RotateReport) {
				if out != "json" {
					fmt.Fprintf(cmd.ErrOrStderr(), "batch %d: %d re-encrypted so far\n", r.Batches, r.Resealed)
				}
			}
			rep, err := store.RotateKeys(cmd.Context(), pool, ring, *batch, progress)
			if err != nil {
				var ke *keyring.KeyError
				if errors.As(err, &ke) {
					return &config.Error{Var: keyring.Var, Problem: err.Error()}
				}
				return err
			}
			if out == "json" {
				if err := printJSON(cmd.OutOrStdout(), rep); err != nil {
					return err
				}
			} else {
				fmt.Fprintln(cmd.OutOrStdout(), describeRotation(rep))
			}
			if rep.Remaining > 0 {
				return fmt.Errorf("%d secret(s) are still not under key %q: a process with an older %s wrote them; update it and run rotate-key again",
					rep.Remaining, rep.KeyID, keyring.Var)
			}
			return nil
		})
	})
	return c
}

// describeRotation is rotate-key's report for humans.
func describeRotation(r store.RotateReport) string {
	var from []string
	if r.FromPlaintext > 0 {
		from = append(from, fmt.Sprintf("%d from plain text", r.FromPlaintext))
	}
	ids := make([]string, 0, len(r.FromKeys))
	for id := range r.FromKeys {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		from = append(from, fmt.Sprintf("%d from key %s", r.FromKeys[id], id))
	}
	s := fmt.Sprintf("re-encrypted %d signing secret(s) under key %s", r.Resealed, r.KeyID)
	if len(from) > 0 {
		s += " (" + strings.Join(from, ", ") + ")"
	}
	s += fmt.Sprintf(" in %d batch(es)", r.Batches)
	if r.Changed > 0 {
		s += fmt.Sprintf("; %d changed by a concurrent rotation and left as it wrote them", r.Changed)
	}
	if r.Resealed == 0 && r.Changed == 0 {
		s = "every signing secret is already under key " + r.KeyID + ": nothing to do"
	}
	return s
}

func newSecretsStatusCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "status",
		Short: "How many signing secrets each key seals (and how many are plain text)",
		Example: `  bridge secrets status
  bridge secrets status -o json`,
		Args: cobra.NoArgs,
	}
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		return withDB(cmd.Context(), func(cfg *config.Config, pool *pgxpool.Pool) error {
			uses, err := store.SecretKeys(cmd.Context(), pool)
			if err != nil {
				return err
			}
			ring := cfg.Secrets.Ring()
			if out == "json" {
				return printList(cmd.OutOrStdout(), uses, "")
			}
			rows := make([][]string, 0, len(uses))
			for _, u := range uses {
				key, state := u.KeyID, ""
				switch {
				case key == "":
					key, state = "(plain text)", "run rotate-key"
				case ring == nil || !ring.Has(key):
					state = "NOT IN " + keyring.Var
				case key == ring.CurrentID():
					state = "current"
				default:
					state = "older: run rotate-key"
				}
				rows = append(rows, []string{key, strconv.FormatInt(u.Secrets, 10), state})
			}
			return printTable(cmd.OutOrStdout(), []string{"KEY", "SECRETS", "STATE"}, rows)
		})
	})
	return c
}
