package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/database"
)

// ScratchSuffix names the database the demo falls back to: "bridge" →
// "bridge_demo".
const ScratchSuffix = "_demo"

// PrepareDatabase migrates the database of cfg and checks (Preflight) that the
// demo may relay from it. When it may not — another application's events are
// waiting there, or relays are running — the demo does not touch them: it
// moves next door, to a scratch database "<name>_demo" on the same server
// (created and migrated when missing), and says so in note. It returns the
// database configuration to run with.
func PrepareDatabase(ctx context.Context, cfg config.Database, embedded bool, log *slog.Logger) (_ config.Database, note string, err error) {
	err = prepare(ctx, cfg, embedded, log)
	// A database whose schema this build cannot vouch for (migrated by a
	// development build from before the baseline) is not the demo's to
	// recreate: it moves next door, like for someone else's events.
	if !errors.Is(err, ErrNotScratch) && !errors.Is(err, database.ErrSchemaUnknown) {
		return cfg, "", err
	}
	reason := err
	scratch, name, serr := scratchURL(cfg.URL)
	if serr != nil {
		return cfg, "", fmt.Errorf("%w (and no scratch database next to it: %v)", reason, serr)
	}
	if cerr := createDatabase(ctx, cfg, name); cerr != nil {
		return cfg, "", fmt.Errorf("%w (and cannot create the scratch database %s: %v)", reason, name, cerr)
	}
	next := cfg
	next.URL = scratch
	err = prepare(ctx, next, embedded, log)
	if errors.Is(err, database.ErrSchemaUnknown) {
		// The scratch database is the demo's own: one from before the
		// baseline is recreated rather than refused.
		log.InfoContext(ctx, "recreating the demo's scratch database (its schema is from an earlier development build)", "database", name)
		if rerr := recreateDatabase(ctx, cfg, name); rerr != nil {
			return cfg, "", fmt.Errorf("scratch database %s: %w (and cannot recreate it: %v)", name, err, rerr)
		}
		err = prepare(ctx, next, embedded, log)
	}
	if err != nil {
		return cfg, "", fmt.Errorf("scratch database %s: %w", name, err)
	}
	why := strings.TrimPrefix(reason.Error(), ErrNotScratch.Error()+": ")
	if errors.Is(reason, database.ErrSchemaUnknown) {
		why = "its schema was created by an earlier development build (recreate it to use it)"
	}
	return next, fmt.Sprintf("instead of %s: %s", dbName(cfg.URL), why), nil
}

// recreateDatabase drops and creates the demo's scratch database name.
func recreateDatabase(ctx context.Context, cfg config.Database, name string) error {
	return onServer(ctx, cfg, func(qctx context.Context, pool *pgxpool.Pool) error {
		if _, err := pool.Exec(qctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return err
		}
		_, err := pool.Exec(qctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		return err
	})
}

// onServer runs f on a connection to cfg's server, bounded by
// database.QueryTimeout: CREATE and DROP DATABASE run outside the database
// they name, and must not hang the demo's start.
func onServer(ctx context.Context, cfg config.Database, f func(qctx context.Context, pool *pgxpool.Pool) error) error {
	pool, err := database.Connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	return f(qctx, pool)
}

func prepare(ctx context.Context, cfg config.Database, embedded bool, log *slog.Logger) error {
	pool, err := database.Connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := database.Migrate(ctx, pool, nil)
	if err != nil {
		return err
	}
	if len(res.Applied) > 0 {
		log.InfoContext(ctx, "migrations applied", "database", config.RedactURL(cfg.URL), "from", res.From, "to", res.To)
	}
	return Preflight(ctx, pool, embedded)
}

// scratchURL returns dsn with its database name suffixed by ScratchSuffix.
func scratchURL(dsn string) (scratch, name string, err error) {
	pc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "", "", err
	}
	if pc.Database == "" || strings.HasSuffix(pc.Database, ScratchSuffix) {
		return "", "", fmt.Errorf("database %q is already the demo's", pc.Database)
	}
	name = pc.Database + ScratchSuffix
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", "", err
		}
		u.Path = "/" + name
		u.RawPath = ""
		return u.String(), name, nil
	}
	return dsn + " dbname=" + name, name, nil
}

func dbName(dsn string) string {
	if pc, err := pgx.ParseConfig(dsn); err == nil {
		return pc.Database
	}
	return "DATABASE_URL"
}

// createDatabase creates name on cfg's server unless it exists.
func createDatabase(ctx context.Context, cfg config.Database, name string) error {
	return onServer(ctx, cfg, func(qctx context.Context, pool *pgxpool.Pool) error {
		var exists bool
		if err := pool.QueryRow(qctx, databaseExistsSQL, name).Scan(&exists); err != nil || exists {
			return err
		}
		_, err := pool.Exec(qctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: a concurrent demo won
			return nil
		}
		return err
	})
}
