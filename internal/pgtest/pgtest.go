// Package pgtest gives each test its own migrated PostgreSQL database, so tests
// that need real commits, NOTIFY and several connections run in parallel
// without seeing each other's rows.
//
// The first test in a run migrates a template database (named after a hash of
// the migrations, so a changed migration gets a fresh template); every test
// then gets `CREATE DATABASE … TEMPLATE`, which copies the migrated schema in
// milliseconds instead of re-running migrations.
package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/database/statement"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/migrations"
)

// DefaultURL is where scripts/services-up.sh starts PostgreSQL.
const DefaultURL = "postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable"

// AdminURL is the server the test databases are created on: DATABASE_URL when
// set, else DefaultURL.
func AdminURL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

var counter atomic.Int64

// DB is one test's database.
type DB struct {
	Pool *pgxpool.Pool
	// URL connects to this test's database (for code that opens its own pool,
	// or a LISTEN connection).
	URL  string
	Name string
}

// NewParallel is the opening of a test whose state is its database: it marks
// t parallel (no other test can see this database's rows, so none can
// disturb it) and returns a fresh database (New).
func NewParallel(t *testing.T) *DB {
	t.Helper()
	t.Parallel()
	return New(t)
}

// New creates a fresh migrated database for t, dropped when t ends.
func New(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := adminConn(ctx, t)
	defer admin.Close(context.Background())
	tpl, err := ensureTemplate(ctx, admin)
	if err != nil {
		t.Fatalf("prepare template database: %v", err)
	}
	name := fmt.Sprintf("bt_%d_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9, counter.Add(1))
	// Two CREATE DATABASE from one template at once can fail with "source
	// database is being accessed by other users"; retry briefly.
	for i := 0; ; i++ {
		_, err = admin.Exec(ctx, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE %s`, name, tpl))
		if err == nil || i == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("create test database: %v", err)
	}
	return connect(ctx, t, name, 20)
}

// adminConn connects to the server as the tests' administrator, or fails
// (CI) / skips the test when PostgreSQL is not there.
func adminConn(ctx context.Context, t testing.TB) *pgx.Conn {
	t.Helper()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		testkit.Unavailable(t, "PostgreSQL at "+config.RedactURL(AdminURL()), "`make services` (scripts/services-up.sh)", err)
	}
	return admin
}

// connect opens a pool of at most maxConns (0: pgxpool's default) on the
// test database name and drops the database when t ends.
func connect(ctx context.Context, t testing.TB, name string, maxConns int32) *DB {
	t.Helper()
	dbURL := withDatabase(AdminURL(), name)
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatalf("parse test database URL: %v", err)
	}
	if maxConns > 0 {
		pcfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatalf("connect test database: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, AdminURL())
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, name))
	})
	return &DB{Pool: pool, URL: dbURL, Name: name}
}

// Column runs sql on q and returns its one column as []T, failing the test
// on any error: how a test reads back what the code under test stored.
func Column[T any](t testing.TB, q statement.Querier, sql string, args ...any) []T {
	t.Helper()
	return collect(t, q, pgx.RowTo[T], sql, args...)
}

// Structs is Column for several columns: each row becomes a T, its exported
// fields filled from the columns in order (pgx.RowToStructByPos).
func Structs[T any](t testing.TB, q statement.Querier, sql string, args ...any) []T {
	t.Helper()
	return collect(t, q, pgx.RowToStructByPos[T], sql, args...)
}

func collect[T any](t testing.TB, q statement.Querier, row pgx.RowToFunc[T], sql string, args ...any) []T {
	t.Helper()
	rows, err := q.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("query %q: %v", sql, err)
	}
	out, err := pgx.CollectRows(rows, row)
	if err != nil {
		t.Fatalf("read %q: %v", sql, err)
	}
	return out
}

// Empty creates an unmigrated database (for migration tests).
func Empty(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := adminConn(ctx, t)
	defer admin.Close(context.Background())
	name := fmt.Sprintf("bt_empty_%d_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9, counter.Add(1))
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+name); err != nil {
		t.Fatalf("create empty database: %v", err)
	}
	return connect(ctx, t, name, 0)
}

func ensureTemplate(ctx context.Context, admin *pgx.Conn) (string, error) {
	name := "bridge_tpl_" + migrationsHash()
	// A session advisory lock serialises template creation across test
	// binaries running in parallel (go test runs packages concurrently).
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_lock(7411001)`); err != nil {
		return "", err
	}
	defer admin.Exec(context.Background(), `SELECT pg_advisory_unlock(7411001)`) //nolint:errcheck
	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	// Build under a temporary name and rename when complete, so a crash
	// half-way never leaves a half-migrated template behind.
	building := name + "_building"
	if _, err := admin.Exec(ctx, `DROP DATABASE IF EXISTS `+building+` WITH (FORCE)`); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+building); err != nil {
		return "", err
	}
	pool, err := pgxpool.New(ctx, withDatabase(AdminURL(), building))
	if err != nil {
		return "", err
	}
	_, err = database.Migrate(ctx, pool, nil)
	pool.Close()
	if err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, `ALTER DATABASE `+building+` RENAME TO `+name); err != nil {
		return "", err
	}
	return name, nil
}

func migrationsHash() string {
	h := sha256.New()
	_ = fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := fs.ReadFile(migrations.FS, path)
		h.Write([]byte(path))
		h.Write(b)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))[:12]
}

func withDatabase(dsn, name string) string {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err == nil {
			u.Path = "/" + name
			return u.String()
		}
	}
	return dsn + " dbname=" + name
}
