package cli

// These tests run the real `bridge` binary as a subprocess with a controlled
// environment: that proves exit codes, that stderr is one line with no panic
// or stack trace, and lets them run in parallel (no t.Setenv).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// TestMain removes the binary built for the subprocess tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// bridgeBinary builds cmd/bridge once per test run (with -race when this test
// binary has it, which also reuses the packages `go test -race` compiled).
func bridgeBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "bridge-cli-test-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "bridge")
		args := []string{"build", "-o", binPath}
		if raceEnabled() {
			args = append(args, "-race")
		}
		args = append(args, "github.com/outboxbridge/bridge/cmd/bridge")
		goBin, err := exec.LookPath("go")
		if err != nil {
			binErr = fmt.Errorf("find the go command: %w", err)
			return
		}
		out, err := exec.Command(goBin, args...).CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatalf("build bridge: %v", binErr)
	}
	return binPath
}

func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true
		}
	}
	return false
}

type result struct {
	code           int
	stdout, stderr string
	elapsed        time.Duration
}

// bridgeCmd prepares `bridge args...` with exactly env (plus PATH).
func bridgeCmd(t *testing.T, ctx context.Context, env map[string]string, args ...string) (*exec.Cmd, *strings.Builder, *strings.Builder) {
	t.Helper()
	cmd := exec.CommandContext(ctx, bridgeBinary(t), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	return cmd, &stdout, &stderr
}

func exitCode(t *testing.T, err error) int {
	t.Helper()
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("run bridge: %v", err)
	}
	return ee.ExitCode()
}

// bridge runs `bridge args...` with exactly env (plus PATH) and waits for it.
func bridge(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd, stdout, stderr := bridgeCmd(t, ctx, env, args...)
	start := time.Now()
	err := cmd.Run()
	r := result{code: exitCode(t, err), stdout: stdout.String(), stderr: stderr.String(), elapsed: time.Since(start)}
	requireNoCrash(t, r)
	return r
}

// requireNoCrash fails on any sign of a panic, stack trace or race report.
func requireNoCrash(t *testing.T, r result) {
	t.Helper()
	for _, bad := range []string{"panic:", "goroutine ", "runtime.", ".go:", "DATA RACE"} {
		if strings.Contains(r.stderr, bad) || strings.Contains(r.stdout, bad) {
			t.Fatalf("output contains %q (exit %d):\nstdout: %s\nstderr: %s", bad, r.code, r.stdout, r.stderr)
		}
	}
}

// requireOneLine asserts stderr is exactly one line.
func requireOneLine(t *testing.T, stderr string) {
	t.Helper()
	if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") {
		t.Errorf("stderr is not exactly one line: %q", stderr)
	}
}

const validURL = "postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable"

func TestCLIConfigBadVariableExitsTwoNamingIt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		variable, value string
	}{
		{"DATABASE_URL", ""}, // unset: see below
		{"RELAY_MAX_ATTEMPTS", "abc"},
		{"RELAY_POLL_INTERVAL", "soon"},
		{"WEBHOOK_POLL_INTERVAL", "soon"},
		{"LOG_FORMAT", "xml"},
		{"LOG_LEVEL", "loud"},
		{"KAFKA_BROKERS", "nohostport"},
		{"KAFKA_SASL_MECHANISM", "GSSAPI"},
		{"WEBHOOK_ALLOWED_CIDRS", "notacidr"},
		{"WEBHOOK_RETRY_SCHEDULE", "5s,banana"},
		{"DATABASE_CONNECT_TIMEOUT", "-1s"},
		// Refused by `bridge migrate` and the rest with 2; config agrees.
		{"DATABASE_URL", "not a url"},
		{"HTTP_ADDR", ":99999"},
		{"HTTP_ADDR", "127.0.0.1:http"},
		{"KAFKA_BROKERS", "k1:9092,k2:0"},
		{"KAFKA_BROKERS", "k1:70000"},
		{"CONSUMER_TOPICS", "a,,b"},
		{"WEBHOOK_ALLOWED_CIDRS", "127.0.0.0/8,"},
		{"WEBHOOK_RETRY_SCHEDULE", "1s,,2s"},
	}
	for _, tt := range tests {
		t.Run(tt.variable+"="+tt.value, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"DATABASE_URL": validURL}
			unset := tt.variable == "DATABASE_URL" && tt.value == ""
			if unset {
				delete(env, "DATABASE_URL")
			} else {
				env[tt.variable] = tt.value
			}
			r := bridge(t, env, "config")
			if r.code != ExitUsage {
				t.Fatalf("exit %d, want %d (stderr %q)", r.code, ExitUsage, r.stderr)
			}
			requireOneLine(t, r.stderr)
			if !strings.Contains(r.stderr, tt.variable) {
				t.Errorf("stderr %q does not name %s", r.stderr, tt.variable)
			}
			switch {
			case unset:
				// The rest of the configuration, the missing one marked.
				if !regexp.MustCompile(`DATABASE_URL\s+\(missing: required\)`).MatchString(r.stdout) || !strings.Contains(r.stdout, "RELAY_MAX_ATTEMPTS") {
					t.Errorf("stdout does not show the configuration with DATABASE_URL marked missing:\n%s", r.stdout)
				}
			case r.stdout != "":
				t.Errorf("stdout %q, want nothing on a config error", r.stdout)
			}
		})
	}
	// A value `bridge config` refuses, the commands that use it refuse too.
	r := bridge(t, map[string]string{"DATABASE_URL": "not a url"}, "migrate")
	if r.code != ExitUsage || !strings.Contains(r.stderr, "DATABASE_URL") {
		t.Errorf("migrate with DATABASE_URL='not a url': exit %d, stderr %q", r.code, r.stderr)
	}
}

// List variables read alike: spaces around commas are trimmed whatever the
// items are (CIDRs, durations, brokers, topics).
func TestCLIConfigListsTrimmedAlike(t *testing.T) {
	t.Parallel()
	r := bridge(t, map[string]string{
		"DATABASE_URL":           validURL,
		"WEBHOOK_ALLOWED_CIDRS":  "127.0.0.0/8, ::1/128",
		"WEBHOOK_RETRY_SCHEDULE": "1s, 2s ,3m",
		"KAFKA_BROKERS":          " k1:9092 , k2:9092",
		"CONSUMER_TOPICS":        "assets, orders",
		"HTTP_ADDR":              "off",
	}, "config", "-o", "json")
	if r.code != ExitOK {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	var settings []config.Setting
	if err := json.Unmarshal([]byte(r.stdout), &settings); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"WEBHOOK_ALLOWED_CIDRS":  "127.0.0.0/8,::1/128",
		"WEBHOOK_RETRY_SCHEDULE": "1s,2s,3m0s",
		"KAFKA_BROKERS":          "k1:9092,k2:9092",
		"CONSUMER_TOPICS":        "assets,orders",
		"HTTP_ADDR":              "off", // not "": the server is off, not unset
	}
	for _, s := range settings {
		if w, ok := want[s.Var]; ok && s.Value != w {
			t.Errorf("%s = %q, want %q", s.Var, s.Value, w)
		}
	}
}

func TestCLIUnknownSubcommandOrFlagPrintsUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		// want are fragments of the error and of the usage text.
		want []string
	}{
		{[]string{"frobnicate"}, []string{`unknown command "frobnicate"`, "Usage:", "migrate", "config", "version"}},
		{[]string{"--bogus"}, []string{"unknown flag: --bogus", "Usage:", "migrate"}},
		{[]string{"migrate", "--bogus"}, []string{"unknown flag: --bogus", "Usage:", "bridge migrate"}},
		{[]string{"config", "-o"}, []string{"flag needs an argument", "Usage:", "--output"}},
		{[]string{"version", "extra"}, []string{"extra", "Usage:", "bridge version"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			// A valid environment: the failure must come from the arguments.
			r := bridge(t, map[string]string{"DATABASE_URL": validURL}, tt.args...)
			if r.code != ExitUsage {
				t.Fatalf("exit %d, want %d (stderr %q)", r.code, ExitUsage, r.stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr does not contain %q:\n%s", w, r.stderr)
				}
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want the usage on stderr only", r.stdout)
			}
		})
	}
}

func TestCLIConfigPrintsRedacted(t *testing.T) {
	t.Parallel()
	secrets := map[string]string{
		"DATABASE_URL":        "postgres://bridge:Db-S3cret-Pw@db.internal:5432/bridge?sslmode=require",
		"ADMIN_TOKEN":         "admin-t0ken-secret",
		"KAFKA_SASL_USERNAME": "sasl-user-secret",
		"KAFKA_SASL_PASSWORD": "sasl-pw-secret",
	}
	env := map[string]string{"KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "KAFKA_BROKERS": "k1:9093,k2:9093", "LOG_FORMAT": "json"}
	for k, v := range secrets {
		env[k] = v
	}
	hidden := []string{"Db-S3cret-Pw", "admin-t0ken-secret", "sasl-user-secret", "sasl-pw-secret"}

	table := bridge(t, env, "config")
	if table.code != ExitOK {
		t.Fatalf("bridge config: exit %d, stderr %q", table.code, table.stderr)
	}
	for _, s := range hidden {
		if strings.Contains(table.stdout+table.stderr, s) {
			t.Errorf("bridge config shows secret %q:\n%s", s, table.stdout)
		}
	}
	for _, want := range []string{"DATABASE_URL", "postgres://bridge:REDACTED@db.internal:5432/bridge", "KAFKA_BROKERS", "k1:9093,k2:9093", "SCRAM-SHA-256", "LOG_FORMAT", "json"} {
		if !strings.Contains(table.stdout, want) {
			t.Errorf("bridge config does not show %q:\n%s", want, table.stdout)
		}
	}

	js := bridge(t, env, "config", "-o", "json")
	if js.code != ExitOK {
		t.Fatalf("bridge config -o json: exit %d, stderr %q", js.code, js.stderr)
	}
	var settings []config.Setting
	if err := json.Unmarshal([]byte(js.stdout), &settings); err != nil {
		t.Fatalf("bridge config -o json is not JSON: %v\n%s", err, js.stdout)
	}
	got := map[string]string{}
	for _, s := range settings {
		got[s.Var] = s.Value
	}
	for k := range secrets {
		if got[k] == secrets[k] || !strings.Contains(got[k], "REDACTED") {
			t.Errorf("%s printed as %q, want it redacted", k, got[k])
		}
	}
	if got["KAFKA_SASL_MECHANISM"] != "SCRAM-SHA-256" || got["RELAY_MAX_ATTEMPTS"] != "10" {
		t.Errorf("non-secret settings wrong: mechanism %q, RELAY_MAX_ATTEMPTS %q", got["KAFKA_SASL_MECHANISM"], got["RELAY_MAX_ATTEMPTS"])
	}
}

func TestCLIVersion(t *testing.T) {
	t.Parallel()
	r := bridge(t, nil, "version")
	if r.code != ExitOK {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	want := regexp.MustCompile(fmt.Sprintf(`^bridge \S+ \(schema version %d\)\n$`, database.LatestVersion()))
	if !want.MatchString(r.stdout) {
		t.Errorf("stdout %q does not match %s", r.stdout, want)
	}
	r = bridge(t, nil, "version", "-o", "json")
	var v struct {
		Version       string `json:"version"`
		SchemaVersion int64  `json:"schema_version"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || r.code != ExitOK || v.Version == "" || v.SchemaVersion != database.LatestVersion() {
		t.Errorf("version -o json: exit %d %q (%v)", r.code, r.stdout, err)
	}
}

const dbPassword = "N0t-In-Stderr-Pw"

func requireConnectFailure(t *testing.T, r result, addr string, timeout time.Duration) {
	t.Helper()
	if r.code != ExitRuntime {
		t.Fatalf("exit %d, want %d (stderr %q)", r.code, ExitRuntime, r.stderr)
	}
	requireOneLine(t, r.stderr)
	if want := "cannot connect to PostgreSQL at " + addr + ": "; !strings.Contains(r.stderr, want) {
		t.Errorf("stderr %q does not say %q", r.stderr, want)
	}
	if strings.Contains(r.stderr, dbPassword) || strings.Contains(r.stdout, dbPassword) {
		t.Errorf("output shows the password: %q", r.stderr)
	}
	// The whole process (start, config, connect, exit) fits well inside
	// the connect timeout plus slack, and never near a 10s bound.
	if r.elapsed > timeout+5*time.Second || r.elapsed > 10*time.Second {
		t.Errorf("bridge migrate took %v with DATABASE_CONNECT_TIMEOUT=%v", r.elapsed, timeout)
	}
	t.Logf("exit %d after %v: %s", r.code, r.elapsed.Round(time.Millisecond), strings.TrimSpace(r.stderr))
}

func TestCLIMigrateClosedPortExitsOne(t *testing.T) {
	t.Parallel()
	r := bridge(t, map[string]string{
		"DATABASE_URL":             "postgres://bridge:" + dbPassword + "@127.0.0.1:1/bridge?sslmode=disable",
		"DATABASE_CONNECT_TIMEOUT": "2s",
	}, "migrate")
	requireConnectFailure(t, r, "127.0.0.1:1", 2*time.Second)
}

// TestCLIMigrateSilentServerTimesOut: a server that accepts TCP and never
// answers, with sslmode left at its default (prefer: a TLS then a plain
// attempt) — the process still exits 1 within the connect timeout.
func TestCLIMigrateSilentServerTimesOut(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Accept and hold every connection, never answering.
	serveTCP(t, ln, func(c net.Conn, _ *sync.WaitGroup) []net.Conn { return []net.Conn{c} })

	const timeout = 2 * time.Second
	r := bridge(t, map[string]string{
		"DATABASE_URL":             "postgres://bridge:" + dbPassword + "@" + ln.Addr().String() + "/bridge",
		"DATABASE_CONNECT_TIMEOUT": timeout.String(),
	}, "migrate")
	requireConnectFailure(t, r, ln.Addr().String(), timeout)
	if r.elapsed < timeout/2 {
		t.Errorf("gave up after %v, before the connect timeout %v", r.elapsed, timeout)
	}
}

// requireOneCorrectSchema checks one complete bridge schema at the latest
// version, each migration recorded exactly once.
func requireOneCorrectSchema(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	latest := database.LatestVersion()
	if v, err := database.SchemaVersion(ctx, pool); err != nil || v != latest {
		t.Errorf("schema version %d (%v), want %d", v, err, latest)
	}
	for _, rel := range []string{"bridge.outbox", "bridge.relay_lanes", "bridge.deliveries"} {
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, rel).Scan(&exists); err != nil || !exists {
			t.Errorf("table %s missing (%v)", rel, err)
		}
	}
	var enqueues, lanes, distinctLanes int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'bridge' AND p.proname = 'enqueue'`).Scan(&enqueues); err != nil || enqueues != 1 {
		t.Errorf("%d bridge.enqueue functions (%v), want 1", enqueues, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT lane) FROM bridge.relay_lanes`).Scan(&lanes, &distinctLanes); err != nil || lanes != 64 || distinctLanes != 64 {
		t.Errorf("bridge.relay_lanes has %d rows, %d distinct (%v), want 64", lanes, distinctLanes, err)
	}
	versions := pgtest.Column[int64](t, pool, `SELECT version_id FROM public.`+database.MigrationsTable+` WHERE version_id > 0 ORDER BY version_id`)
	if want := database.Versions(); !slices.Equal(versions, want) {
		t.Errorf("%s records versions %v, want each of %v once", database.MigrationsTable, versions, want)
	}
}

func TestCLIMigrateTwiceIsNoop(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	env := map[string]string{"DATABASE_URL": db.URL}
	latest := database.LatestVersion()

	first := bridge(t, env, "migrate")
	if first.code != ExitOK {
		t.Fatalf("first migrate: exit %d, stderr %q", first.code, first.stderr)
	}
	if want := fmt.Sprintf("migrated from version 0 to %d", latest); !strings.Contains(first.stdout, want) {
		t.Errorf("first migrate stdout %q, want %q", first.stdout, want)
	}
	second := bridge(t, env, "migrate")
	if second.code != ExitOK {
		t.Fatalf("second migrate: exit %d, stderr %q", second.code, second.stderr)
	}
	if want := fmt.Sprintf("schema is up to date at version %d\n", latest); second.stdout != want {
		t.Errorf("second migrate stdout %q, want %q", second.stdout, want)
	}
	requireOneCorrectSchema(t, db.Pool)
}

func TestCLIMigrateRefusesNewerSchema(t *testing.T) {
	db, env := migratedByCLI(t)
	newer := database.LatestVersion() + 1
	if _, err := db.Pool.Exec(context.Background(), `INSERT INTO public.`+database.MigrationsTable+` (version_id, is_applied) VALUES ($1, true)`, newer); err != nil {
		t.Fatal(err)
	}

	r := bridge(t, env, "migrate")
	if r.code != ExitRuntime {
		t.Fatalf("migrate on a newer schema: exit %d, want %d (stdout %q, stderr %q)", r.code, ExitRuntime, r.stdout, r.stderr)
	}
	requireOneLine(t, r.stderr)
	for _, want := range []string{"newer", fmt.Sprint(newer), fmt.Sprint(database.LatestVersion())} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr %q does not mention %q", r.stderr, want)
		}
	}
	if v, err := database.SchemaVersion(context.Background(), db.Pool); err != nil || v != newer {
		t.Errorf("schema version %d (%v) after refusing, want it left at %d", v, err, newer)
	}
}

// A database migrated by a development build from before the migrations were
// folded into the baseline (here: at version 7): `bridge migrate` exits 1 with
// one line that says to recreate it, and applies nothing.
func TestCLIMigrateRefusesDatabaseFromBeforeTheFold(t *testing.T) {
	db, env := migratedByCLI(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `DELETE FROM public.`+database.MigrationsTable+` WHERE version_id > 1`); err != nil {
		t.Fatal(err)
	}
	for v := 2; v <= 7; v++ {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO public.`+database.MigrationsTable+` (version_id, is_applied) VALUES ($1, true)`, v); err != nil {
			t.Fatal(err)
		}
	}

	r := bridge(t, env, "migrate")
	if r.code != ExitRuntime {
		t.Fatalf("migrate on a pre-fold database: exit %d, want %d (stdout %q, stderr %q)", r.code, ExitRuntime, r.stdout, r.stderr)
	}
	requireOneLine(t, r.stderr)
	for _, want := range []string{"database schema version 7 was created by an earlier development build", "recreate the database"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr %q does not say %q", r.stderr, want)
		}
	}
	if v, err := database.SchemaVersion(ctx, db.Pool); err != nil || v != 7 {
		t.Errorf("schema version %d (%v) after refusing, want it left at 7", v, err)
	}
}

// TestCLIMigrateConcurrentProcesses starts two `bridge migrate` processes at
// once on one empty database, three times: both succeed each time, exactly
// one applies the migrations, and one correct schema results.
func TestCLIMigrateConcurrentProcesses(t *testing.T) {
	t.Parallel()
	for round := range 3 {
		t.Run(fmt.Sprint("round", round), func(t *testing.T) {
			db := pgtest.Empty(t)
			env := map[string]string{"DATABASE_URL": db.URL}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			type proc struct {
				cmd            *exec.Cmd
				stdout, stderr *strings.Builder
			}
			procs := make([]proc, 2)
			for i := range procs {
				cmd, out, errb := bridgeCmd(t, ctx, env, "migrate")
				procs[i] = proc{cmd, out, errb}
			}
			for _, p := range procs {
				if err := p.cmd.Start(); err != nil {
					t.Fatal(err)
				}
			}
			var migrated, upToDate int
			for i, p := range procs {
				r := result{code: exitCode(t, p.cmd.Wait()), stdout: p.stdout.String(), stderr: p.stderr.String()}
				requireNoCrash(t, r)
				if r.code != ExitOK {
					t.Errorf("process %d: exit %d, stderr %q", i, r.code, r.stderr)
				}
				switch {
				case strings.HasPrefix(r.stdout, "migrated from version 0 to "):
					migrated++
				case strings.HasPrefix(r.stdout, "schema is up to date at version "):
					upToDate++
				}
				t.Logf("process %d: %s", i, strings.TrimSpace(r.stdout))
			}
			if migrated != 1 || upToDate != 1 {
				t.Errorf("%d processes migrated and %d found the schema up to date, want 1 and 1", migrated, upToDate)
			}
			requireOneCorrectSchema(t, db.Pool)
		})
	}
}

// migratedByCLI is the opening of a test of what `bridge migrate` does to a
// database it migrated before: in parallel (the database is its own), an
// empty database brought to the latest version by `bridge migrate`, and the
// environment that points the CLI at it.
func migratedByCLI(t *testing.T) (*pgtest.DB, map[string]string) {
	t.Helper()
	t.Parallel()
	db := pgtest.Empty(t)
	env := map[string]string{"DATABASE_URL": db.URL}
	if r := bridge(t, env, "migrate"); r.code != ExitOK {
		t.Fatalf("migrate: exit %d, stderr %q", r.code, r.stderr)
	}
	return db, env
}
