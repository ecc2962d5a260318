package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/keyring"
	"github.com/outboxbridge/bridge/internal/logging"
	"github.com/outboxbridge/bridge/internal/version"
)

func init() {
	register(newMigrateCmd)
	register(newConfigCmd)
	register(newVersionCmd)
}

// newLogger builds the process logger from the configuration (to stderr, so
// stdout stays clean for -o json).
func newLogger(cfg *config.Config) *slog.Logger {
	return logging.New(os.Stderr, cfg.Log.Level, cfg.Log.Format)
}

// openDB connects to DATABASE_URL.
func openDB(ctx context.Context, cfg *config.Config) (*pgxpool.Pool, error) {
	return database.Connect(ctx, cfg.Database)
}

// openCurrentDB connects and checks the schema is what this binary expects.
func openCurrentDB(ctx context.Context, cfg *config.Config) (*pgxpool.Pool, error) {
	pool, err := openDB(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := database.CheckCurrent(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// withDB runs f with the configuration and the migrated database, for the
// short-lived operator commands.
func withDB(ctx context.Context, f func(cfg *config.Config, pool *pgxpool.Pool) error) error {
	return withDBNeeds(ctx, config.Needs{Database: true}, f)
}

// withDBNeeds is withDB for a command that needs more than the database
// (needs.Database is implied).
func withDBNeeds(ctx context.Context, needs config.Needs, f func(cfg *config.Config, pool *pgxpool.Pool) error) error {
	needs.Database = true
	cfg, err := loadConfig(needs)
	if err != nil {
		return err
	}
	pool, err := openCurrentDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	return f(cfg, pool)
}

func newMigrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "migrate",
		GroupID: groupSetup,
		Short:   "Apply the bridge's database migrations (safe from several replicas at once)",
		Example: `  DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable bridge migrate`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(config.Needs{Database: true})
			if err != nil {
				return err
			}
			logger := newLogger(cfg)
			pool, err := openDB(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer pool.Close()
			res, err := database.Migrate(cmd.Context(), pool, nil)
			if err != nil {
				return err
			}
			if len(res.Applied) == 0 {
				logger.Info("schema is up to date", "version", res.To)
				fmt.Fprintf(cmd.OutOrStdout(), "schema is up to date at version %d\n", res.To)
				return nil
			}
			logger.Info("migrations applied", "from", res.From, "to", res.To, "applied", res.Applied)
			fmt.Fprintf(cmd.OutOrStdout(), "migrated from version %d to %d (applied %v)\n", res.From, res.To, res.Applied)
			return nil
		},
	}
}

func newConfigCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "config",
		GroupID: groupSetup,
		Short:   "Print the effective configuration (secrets redacted)",
		Example: `  bridge config
  bridge config -o json`,
		Args: cobra.NoArgs,
	}
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		cfg, err := loadConfig(config.Needs{Database: true})
		var ce *config.Error
		if err != nil && (!errors.As(err, &ce) || !ce.Unset()) {
			return err // a value set wrong: exit 2 naming it, as every command does
		}
		if err != nil {
			// A required variable is missing: still show the rest (the
			// defaults are what people run config for), mark the missing
			// one, and exit 2 like every command that needs it.
			full, lerr := loadConfig(config.Needs{})
			if lerr != nil {
				return lerr
			}
			cfg = full
		}
		settings := cfg.Settings()
		for i := range settings {
			if settings[i].Var == keyring.Var && settings[i].Value == "" {
				// Where an operator looks first: what it takes.
				settings[i].Value = secretKeysUnset
			}
			if settings[i].Var == "HTTP_ADDR" && settings[i].Value == "" {
				// config.Load turns "off" into "" for the runtime; show
				// what the operator set.
				settings[i].Value = config.HTTPOff
			}
		}
		if ce != nil {
			for i := range settings {
				if settings[i].Var == ce.Var {
					settings[i].Value = missingValue
				}
			}
		}
		if out == "json" {
			if perr := printJSON(cmd.OutOrStdout(), settings); perr != nil {
				return perr
			}
		} else {
			rows := make([][]string, len(settings))
			for i, s := range settings {
				rows[i] = []string{s.Component, s.Var, s.Value}
			}
			if perr := printTable(cmd.OutOrStdout(), []string{"COMPONENT", "VARIABLE", "VALUE"}, rows); perr != nil {
				return perr
			}
		}
		return err
	})
	return c
}

// missingValue marks a required variable that is not set in `bridge config`.
const missingValue = "(missing: required)"

// secretKeysUnset is how `bridge config` shows an unset BRIDGE_SECRET_KEYS.
const secretKeysUnset = "(not set: required by deliver, run, secret writes and the admin API; format: " + keyring.Format + ")"

func newVersionCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "version",
		GroupID: groupSetup,
		Short:   "Print the bridge version and the schema version it needs",
		Example: `  bridge version
  bridge version -o json`,
		Args: cobra.NoArgs,
	}
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		if out == "json" {
			return printJSON(cmd.OutOrStdout(), struct {
				Version       string `json:"version"`
				SchemaVersion int64  `json:"schema_version"`
			}{version.String(), database.LatestVersion()})
		}
		fmt.Fprintf(cmd.OutOrStdout(), "bridge %s (schema version %d)\n", version.String(), database.LatestVersion())
		return nil
	})
	return c
}
