package database_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/migrations"
)

// migrationVersions lists the versions of the embedded migrations, ascending.
func migrationVersions(t *testing.T) []int64 {
	t.Helper()
	entries, err := migrations.FS.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var out []int64
	for _, e := range entries {
		if v, err := goose.NumericComponent(e.Name()); err == nil && strings.HasSuffix(e.Name(), ".sql") {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	if len(out) == 0 || out[len(out)-1] != database.LatestVersion() {
		t.Fatalf("embedded migrations %v do not end at LatestVersion %d", out, database.LatestVersion())
	}
	return out
}

// requireOneCorrectSchema checks the database holds exactly one complete copy
// of the bridge schema at the latest version.
func requireOneCorrectSchema(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	v, err := database.SchemaVersion(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if v != database.LatestVersion() {
		t.Errorf("schema version %d, want %d", v, database.LatestVersion())
	}
	for _, rel := range []string{"bridge.outbox", "bridge.relay_lanes", "bridge.deliveries", "bridge.subscriptions", "bridge.delivery_attempts", "bridge.consumer_inbox"} {
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, rel).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if !exists {
			t.Errorf("table %s missing", rel)
		}
	}
	var enqueues int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'bridge' AND p.proname = 'enqueue'`).Scan(&enqueues); err != nil {
		t.Fatal(err)
	}
	if enqueues != 1 {
		t.Errorf("%d bridge.enqueue functions, want 1", enqueues)
	}
	var lanes, distinct, minLane, maxLane int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT lane), coalesce(min(lane), -1), coalesce(max(lane), -1) FROM bridge.relay_lanes`).Scan(&lanes, &distinct, &minLane, &maxLane); err != nil {
		t.Fatal(err)
	}
	if lanes != 64 || distinct != 64 || minLane != 0 || maxLane != 63 {
		t.Errorf("relay_lanes: %d rows, %d distinct, lanes %d..%d; want 64 rows, lanes 0..63", lanes, distinct, minLane, maxLane)
	}
	rows, err := pool.Query(ctx, `SELECT version_id, count(*) FROM public.`+database.MigrationsTable+` WHERE version_id > 0 GROUP BY version_id ORDER BY version_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var recorded []int64
	for rows.Next() {
		var version, n int64
		if err := rows.Scan(&version, &n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("version %d recorded %d times in %s, want once", version, n, database.MigrationsTable)
		}
		recorded = append(recorded, version)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := migrationVersions(t); !slices.Equal(recorded, want) {
		t.Errorf("%s records versions %v, want %v", database.MigrationsTable, recorded, want)
	}
}

func TestMigrateTwiceIsNoop(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	ctx := context.Background()

	first, err := database.Migrate(ctx, db.Pool, nil)
	if err != nil {
		t.Fatalf("first Migrate: %v", err)
	}
	if want := migrationVersions(t); first.From != 0 || first.To != database.LatestVersion() || !slices.Equal(first.Applied, want) {
		t.Errorf("first Migrate = %+v, want from 0 to %d applying %v", first, database.LatestVersion(), want)
	}
	second, err := database.Migrate(ctx, db.Pool, nil)
	if err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if len(second.Applied) != 0 || second.From != database.LatestVersion() || second.To != database.LatestVersion() {
		t.Errorf("second Migrate = %+v, want a no-op at %d", second, database.LatestVersion())
	}
	requireOneCorrectSchema(t, db.Pool)
	if err := database.CheckCurrent(ctx, db.Pool); err != nil {
		t.Errorf("CheckCurrent after migrating: %v", err)
	}
}

// TestMigrateConcurrentReplicas starts four replicas' migrations at once on
// one empty database, each with its own pool: every one succeeds, each
// migration is applied by exactly one of them, and one correct schema results.
func TestMigrateConcurrentReplicas(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const replicas = 4
	pools := make([]*pgxpool.Pool, replicas)
	for i := range pools {
		p, err := pgxpool.New(ctx, db.URL)
		if err != nil {
			t.Fatal(err)
		}
		// Open a connection up front so the replicas race on Migrate, not on
		// connection setup.
		if err := p.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		pools[i] = p
	}
	results := make([]database.MigrationResult, replicas)
	errs := make([]error, replicas)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() {
			<-start
			results[i], errs[i] = database.Migrate(ctx, pools[i], nil)
		})
	}
	close(start)
	wg.Wait()

	var applied []int64
	for i := range replicas {
		if errs[i] != nil {
			t.Errorf("replica %d: Migrate: %v", i, errs[i])
			continue
		}
		if results[i].To != database.LatestVersion() {
			t.Errorf("replica %d: ended at version %d, want %d", i, results[i].To, database.LatestVersion())
		}
		applied = append(applied, results[i].Applied...)
		t.Logf("replica %d: %+v", i, results[i])
	}
	slices.Sort(applied)
	if want := migrationVersions(t); !slices.Equal(applied, want) {
		t.Errorf("replicas applied %v between them, want each of %v exactly once", applied, want)
	}
	requireOneCorrectSchema(t, db.Pool)
}

func TestMigrateRefusesNewerSchema(t *testing.T) {
	db, ctx := migratedParallel(t)
	newer := database.LatestVersion() + 1
	if _, err := db.Pool.Exec(ctx, `INSERT INTO public.`+database.MigrationsTable+` (version_id, is_applied) VALUES ($1, true)`, newer); err != nil {
		t.Fatalf("record a newer version: %v", err)
	}

	res, err := database.Migrate(ctx, db.Pool, nil)
	if !errors.Is(err, database.ErrSchemaNewer) {
		t.Fatalf("Migrate on a newer schema: err = %v, want ErrSchemaNewer", err)
	}
	for _, want := range []string{"newer", fmt.Sprint(newer), fmt.Sprint(database.LatestVersion())} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if len(res.Applied) != 0 {
		t.Errorf("Migrate applied %v on a newer schema", res.Applied)
	}
	// Nothing was rolled back or rewritten.
	v, err := database.SchemaVersion(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if v != newer {
		t.Errorf("schema version %d after refusing, want it left at %d", v, newer)
	}
	if err := database.CheckCurrent(ctx, db.Pool); !errors.Is(err, database.ErrSchemaNewer) {
		t.Errorf("CheckCurrent on a newer schema: %v, want ErrSchemaNewer", err)
	}
}

// A development database migrated before 00001–00007 were folded into the
// baseline has versions this build no longer carries: Migrate refuses it with
// advice to recreate it, and applies nothing on top of a schema it cannot
// vouch for; readiness says the same.
func TestMigrateRefusesDatabaseFromBeforeTheFold(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		history func(t *testing.T, db *pgtest.DB)
		version string
	}{
		{"at version 7", func(t *testing.T, db *pgtest.DB) {
			// What a pre-fold build left: versions 1–7 applied, nothing later.
			exec(t, db, `DELETE FROM public.`+database.MigrationsTable+` WHERE version_id > 1`)
			for v := 2; v <= 7; v++ {
				exec(t, db, `INSERT INTO public.`+database.MigrationsTable+` (version_id, is_applied) VALUES ($1, true)`, v)
			}
		}, "version 7"},
		{"at version 1 of the old layout", func(t *testing.T, db *pgtest.DB) {
			// The development 00001 created the outbox only.
			exec(t, db, `DELETE FROM public.`+database.MigrationsTable+` WHERE version_id > 1`)
			exec(t, db, `DROP TABLE bridge.relay_members, bridge.relay_lanes`)
		}, "version 1"},
		{"at a baseline from before 00030 was folded into it, without 00030", func(t *testing.T, db *pgtest.DB) {
			// That baseline had no topic check, and 00030 (which added it)
			// no longer exists to be applied: enqueue would accept topic
			// names Kafka refuses.
			exec(t, db, `DROP FUNCTION bridge.topic_name_problem(text) CASCADE`)
		}, "version 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db, ctx := migratedParallel(t)
			c.history(t, db)
			before, err := database.SchemaVersion(ctx, db.Pool)
			if err != nil {
				t.Fatal(err)
			}

			res, err := database.Migrate(ctx, db.Pool, nil)
			if !errors.Is(err, database.ErrSchemaUnknown) {
				t.Fatalf("Migrate = %v, want ErrSchemaUnknown", err)
			}
			for _, want := range []string{"database schema " + c.version + " was created by an earlier development build", "recreate the database"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if len(res.Applied) != 0 {
				t.Errorf("Migrate applied %v on a pre-fold database", res.Applied)
			}
			if after, err := database.SchemaVersion(ctx, db.Pool); err != nil || after != before {
				t.Errorf("schema version %d (%v) after refusing, want it left at %d", after, err, before)
			}
			if err := database.CheckCurrent(ctx, db.Pool); !errors.Is(err, database.ErrSchemaUnknown) {
				t.Errorf("CheckCurrent = %v, want ErrSchemaUnknown", err)
			}
		})
	}
}

// A database migrated by a build that still had 00030 (the topic check, since
// folded into the baseline) records version 30: it has that migration's
// effect, so it is current, and Migrate carries on from it.
func TestMigrateAcceptsMigrationFoldedIntoTheBaseline(t *testing.T) {
	db, ctx := migratedParallel(t)
	exec(t, db, `INSERT INTO public.`+database.MigrationsTable+` (version_id, is_applied) VALUES (30, true)`)
	if res, err := database.Migrate(ctx, db.Pool, nil); err != nil || len(res.Applied) != 0 {
		t.Fatalf("Migrate with 00030 recorded = %+v, %v; want nothing applied and no error", res, err)
	}
	if err := database.CheckCurrent(ctx, db.Pool); err != nil {
		t.Errorf("CheckCurrent with 00030 recorded: %v", err)
	}
}

// A database that records a migration this build does not carry (below its
// latest: a different build's) is refused too, rather than migrated around it.
func TestMigrateRefusesUnknownVersion(t *testing.T) {
	db, ctx := migratedParallel(t)
	// 8 and 9 are never used: new migrations take reserved ranges from 10.
	const stray = lastFolded + 1
	if slices.Contains(migrationVersions(t), stray) || stray >= database.LatestVersion() {
		t.Fatalf("version %d is a migration of this build (or not below its latest %d): pick another stray", stray, database.LatestVersion())
	}
	exec(t, db, `INSERT INTO public.`+database.MigrationsTable+` (version_id, is_applied) VALUES ($1, true)`, stray)
	_, err := database.Migrate(ctx, db.Pool, nil)
	if !errors.Is(err, database.ErrSchemaUnknown) || !strings.Contains(err.Error(), fmt.Sprintf("migration %d", stray)) {
		t.Fatalf("Migrate = %v, want ErrSchemaUnknown naming migration %d", err, stray)
	}
}

// lastFolded is the last development version folded into the baseline.
const lastFolded = 7

func exec(t *testing.T, db *pgtest.DB, sql string, args ...any) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestCheckCurrentOnUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	ctx := context.Background()
	if v, err := database.SchemaVersion(ctx, db.Pool); err != nil || v != 0 {
		t.Fatalf("SchemaVersion of an empty database = %d, %v; want 0", v, err)
	}
	err := database.CheckCurrent(ctx, db.Pool)
	if err == nil || !strings.Contains(err.Error(), "bridge migrate") {
		t.Errorf("CheckCurrent on an empty database = %v, want advice to run bridge migrate", err)
	}
}

const secretPassword = "Sup3r-Secret-Pw"

func requireConnectError(t *testing.T, err error, addr string) {
	t.Helper()
	var ce *database.ConnectError
	if !errors.As(err, &ce) {
		t.Fatalf("Connect error %v (%T), want *database.ConnectError", err, err)
	}
	if want := "cannot connect to PostgreSQL at " + addr + ": "; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("message %q does not start with %q", err, want)
	}
	if strings.Contains(err.Error(), secretPassword) {
		t.Errorf("message %q shows the password", err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("message %q is more than one line", err)
	}
}

func TestConnectClosedPort(t *testing.T) {
	t.Parallel()
	cfg := config.Database{
		URL:            "postgres://bridge:" + secretPassword + "@127.0.0.1:1/bridge?sslmode=disable",
		ConnectTimeout: 2 * time.Second,
		MaxConns:       2,
	}
	start := time.Now()
	pool, err := database.Connect(context.Background(), cfg)
	if err == nil {
		pool.Close()
		t.Fatal("Connect to a closed port succeeded")
	}
	requireConnectError(t, err, "127.0.0.1:1")
	if elapsed := time.Since(start); elapsed > cfg.ConnectTimeout+time.Second {
		t.Errorf("Connect took %v, want at most the connect timeout %v", elapsed, cfg.ConnectTimeout)
	}
	t.Logf("%v", err)
}

// TestConnectSilentServerTimesOut points DATABASE_URL at a server that accepts
// the TCP connection and never answers: Connect gives up after the connect
// timeout (and not much later) with "timed out".
func TestConnectSilentServerTimesOut(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held sync.WaitGroup
	conns := make(chan net.Conn, 16)
	held.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c // hold it open, say nothing
		}
	})
	defer func() {
		ln.Close()
		held.Wait()
		close(conns)
		for c := range conns {
			c.Close()
		}
	}()

	addr := ln.Addr().String()
	for _, sslmode := range []string{"disable", "prefer"} {
		t.Run(sslmode, func(t *testing.T) {
			cfg := config.Database{
				URL:            "postgres://bridge:" + secretPassword + "@" + addr + "/bridge?sslmode=" + sslmode,
				ConnectTimeout: time.Second,
				MaxConns:       2,
			}
			start := time.Now()
			pool, err := database.Connect(context.Background(), cfg)
			elapsed := time.Since(start)
			if err == nil {
				pool.Close()
				t.Fatal("Connect to a silent server succeeded")
			}
			requireConnectError(t, err, addr)
			if elapsed < cfg.ConnectTimeout/2 || elapsed > cfg.ConnectTimeout+2*time.Second {
				t.Errorf("Connect gave up after %v, want about the connect timeout %v", elapsed, cfg.ConnectTimeout)
			}
			if !strings.Contains(err.Error(), "timeout") && !strings.Contains(err.Error(), "timed out") {
				t.Errorf("message %q does not say it timed out", err)
			}
			t.Logf("after %v: %v", elapsed.Round(time.Millisecond), err)
		})
	}
}

// cannotCheck ends a test whose environment cannot show what it checks. Under
// CI=true the environment is the one scripts/services-up.sh builds (a URL
// DSN, password authentication), so there it is a failure, never a skip.
func cannotCheck(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}

func TestConnectWrongPasswordNotEchoed(t *testing.T) {
	t.Parallel()
	pgtest.Empty(t) // fails under CI=true (skips otherwise) when PostgreSQL is down
	u, err := url.Parse(pgtest.AdminURL())
	if err != nil || u.Host == "" {
		cannotCheck(t, "admin URL is not in URL form; this test builds a wrong-password URL from it")
	}
	u.User = url.UserPassword(u.User.Username(), secretPassword)
	cfg := config.Database{URL: u.String(), ConnectTimeout: 5 * time.Second, MaxConns: 2}
	pool, err := database.Connect(context.Background(), cfg)
	if err == nil {
		pool.Close()
		cannotCheck(t, "the server accepted a wrong password (trust authentication); nothing to check")
	}
	requireConnectError(t, err, u.Host)
	if !strings.Contains(err.Error(), "password authentication failed") {
		t.Errorf("message %q does not give the server's reason", err)
	}
	t.Logf("%v", err)
}

func TestConnectUnparseableURLNamesVariable(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://bridge:" + secretPassword + "@127.0.0.1:notaport/bridge",
		"host=127.0.0.1 password=" + secretPassword + " sslmode=bogus",
	} {
		_, err := database.Connect(context.Background(), config.Database{URL: dsn, ConnectTimeout: time.Second, MaxConns: 2})
		var ce *config.Error
		if !errors.As(err, &ce) || ce.Var != "DATABASE_URL" {
			t.Errorf("Connect(%q) = %v, want a *config.Error naming DATABASE_URL", dsn, err)
			continue
		}
		if strings.Contains(err.Error(), secretPassword) {
			t.Errorf("error %q shows the password", err)
		}
		t.Logf("%v", err)
	}
}

// migratedParallel is the opening of a test of what Migrate does to a
// database it migrated before: the test runs in parallel (the database is its
// own) on an empty database brought to the latest version by Migrate itself
// (not pgtest's template), and gets t's context.
func migratedParallel(t *testing.T) (*pgtest.DB, context.Context) {
	t.Helper()
	t.Parallel()
	db, ctx := pgtest.Empty(t), t.Context()
	if _, err := database.Migrate(ctx, db.Pool, nil); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return db, ctx
}
