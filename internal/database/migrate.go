package database

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/outboxbridge/bridge/migrations"
)

// MigrationsTable records applied migration versions (in the public schema,
// since the first migration creates schema bridge).
const MigrationsTable = "bridge_schema_migrations"

// migrationLockID is the PostgreSQL advisory lock that serialises concurrent
// `bridge migrate` runs from several replicas: one applies, the others wait
// for it and then find nothing to do.
const migrationLockID = 0x6f7574626f78 // "outbox"

// ErrSchemaNewer means the database was migrated by a newer bridge; this binary
// refuses to run against it rather than downgrade or misread it.
var ErrSchemaNewer = errors.New("database schema is newer than this binary")

// ErrSchemaUnknown means the database records a migration this binary does
// not carry: most likely a development database migrated before 00001–00007
// were folded into the baseline. Applying the baseline's successors on top of
// a schema of unknown shape could corrupt it, so the bridge refuses and says to
// recreate the database.
var ErrSchemaUnknown = errors.New("database schema was not created by this build's migrations")

// lastFoldedVersion is the last of the migration versions of development builds before the
// baseline (00001–00007, folded into 00001_baseline.sql before the first
// release). A database that has one of them applied has no upgrade path.
const lastFoldedVersion = 7

// foldedIntoBaseline are later development migrations whose effect the
// baseline now creates itself (00030: bridge.enqueue refusing topic names
// Kafka refuses). A database that recorded one of them has its effect already,
// so it is known; a database whose baseline predates one and never applied it
// lacks its effect, and checkKnown refuses it (see baselineIsCurrent).
var foldedIntoBaseline = []int64{30}

// MigrationResult reports what Migrate did.
type MigrationResult struct {
	From, To int64
	Applied  []int64
}

func newProvider(pool *pgxpool.Pool, logger *slog.Logger) (*goose.Provider, *sql.DB, error) {
	db := stdlib.OpenDBFromPool(pool)
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(migrationLockID), lock.WithLockTimeout(1, 600))
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("create migration lock: %w", err)
	}
	opts := []goose.ProviderOption{goose.WithSessionLocker(locker), goose.WithTableName("public." + MigrationsTable)}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS, opts...)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("load migrations: %w", err)
	}
	return p, db, nil
}

// LatestVersion is the newest migration this binary carries.
func LatestVersion() int64 {
	entries, _ := migrations.FS.ReadDir(".")
	var latest int64
	for _, e := range entries {
		v, err := goose.NumericComponent(e.Name())
		if err == nil && v > latest {
			latest = v
		}
	}
	return latest
}

// Versions lists the versions of the embedded migrations, ascending (with
// gaps: each area of the code appends in its own range of numbers).
func Versions() []int64 {
	entries, _ := migrations.FS.ReadDir(".")
	var out []int64
	for _, e := range entries {
		if v, err := goose.NumericComponent(e.Name()); err == nil {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}

// checkKnown refuses a database whose applied migrations this binary cannot
// account for (newer ones are ErrSchemaNewer, checked by the callers):
//   - one of the folded development versions 2–7, or version 1 without the
//     tables of the baseline (a database migrated by a build before the fold,
//     whose 00001 was a smaller file): "recreate the database";
//   - any other version this binary does not carry, at or below its latest.
func checkKnown(ctx context.Context, pool *pgxpool.Pool) error {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, "public."+MigrationsTable).Scan(&exists); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if !exists {
		return nil
	}
	rows, err := pool.Query(ctx, `SELECT DISTINCT version_id FROM `+MigrationsTable+` WHERE is_applied AND version_id > 0 ORDER BY version_id`)
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	known, latest := Versions(), LatestVersion()
	var folded, unknown int64
	for _, v := range applied {
		switch {
		case v > latest:
		case v >= 2 && v <= lastFoldedVersion:
			folded = v
		case !slices.Contains(known, v) && !slices.Contains(foldedIntoBaseline, v):
			unknown = v
		}
	}
	if folded == 0 && slices.Contains(applied, 1) {
		// Version 1 may be the development 00001, which created the outbox
		// only (the baseline's relay lanes tell the two apart), or a baseline
		// from before a later migration was folded into it that never
		// applied that migration (its topic check is missing).
		var lanes, topicCheck bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass('bridge.relay_lanes') IS NOT NULL,
			to_regprocedure('bridge.topic_name_problem(text)') IS NOT NULL`).Scan(&lanes, &topicCheck); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		if !lanes || !topicCheck {
			folded = 1
		}
	}
	switch {
	case folded > 0:
		return fmt.Errorf("%w: database schema version %d was created by an earlier development build; recreate the database "+
			"(migrations 00001–00007 were folded into one baseline before the first release, and there is no upgrade from before it)",
			ErrSchemaUnknown, folded)
	case unknown > 0:
		return fmt.Errorf("%w: database has migration %d applied, which this build does not carry (it was migrated by a different build); "+
			"use the build that migrated it, or recreate the database", ErrSchemaUnknown, unknown)
	}
	return nil
}

// SchemaVersion returns the database's applied migration version (0 when
// never migrated).
func SchemaVersion(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, "public."+MigrationsTable).Scan(&exists); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int64
	err := pool.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM `+MigrationsTable+` WHERE is_applied`).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}

// Migrate applies every pending migration. It is safe to run concurrently
// from several replicas, and refuses a database migrated by a newer binary.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (MigrationResult, error) {
	current, err := SchemaVersion(ctx, pool)
	if err != nil {
		return MigrationResult{}, err
	}
	latest := LatestVersion()
	if current > latest {
		return MigrationResult{From: current, To: current}, fmt.Errorf("%w: database is at version %d, this binary knows up to %d; upgrade the bridge instead of migrating down", ErrSchemaNewer, current, latest)
	}
	if err := checkKnown(ctx, pool); err != nil {
		return MigrationResult{From: current, To: current}, err
	}
	p, db, err := newProvider(pool, logger)
	if err != nil {
		return MigrationResult{}, err
	}
	defer db.Close()
	results, err := p.Up(ctx)
	res := MigrationResult{From: current, To: current}
	for _, r := range results {
		if r.Error == nil && !r.Empty {
			res.Applied = append(res.Applied, r.Source.Version)
		}
	}
	if err != nil {
		return res, fmt.Errorf("apply migrations: %w", err)
	}
	// Another replica may have applied them while we waited for the lock.
	if res.To, err = SchemaVersion(ctx, pool); err != nil {
		return res, err
	}
	return res, nil
}

// CheckCurrent reports whether the schema is exactly what this binary expects
// (readiness: a replica must not serve against an unmigrated database).
func CheckCurrent(ctx context.Context, pool *pgxpool.Pool) error {
	v, err := SchemaVersion(ctx, pool)
	if err != nil {
		return err
	}
	latest := LatestVersion()
	if v <= latest {
		if err := checkKnown(ctx, pool); err != nil {
			return err
		}
	}
	switch {
	case v < latest:
		return fmt.Errorf("database schema is at version %d, this binary needs %d: run `bridge migrate`", v, latest)
	case v > latest:
		return fmt.Errorf("%w: database is at version %d, this binary knows up to %d", ErrSchemaNewer, v, latest)
	}
	return nil
}
