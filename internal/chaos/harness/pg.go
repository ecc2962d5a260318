package harness

import (
	"context"

	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PG is a PostgreSQL instance of the test's own: initdb'd into a directory
// of its own and run with pg_ctl on its own loopback port (as the postgres OS
// user when the test runs as root). Restarting, stopping with -m immediate or
// promoting it never touches the shared server.
type PG struct {
	t    testing.TB
	Bin  string
	Dir  string // data directory
	Port int
	Name string // application_name for replication
}

// URL connects to database db as the superuser bridge (trust auth).
func (p *PG) URL(db string) string {
	return fmt.Sprintf("postgres://bridge@127.0.0.1:%d/%s?sslmode=disable", p.Port, db)
}

func baseDir(t testing.TB, prefix string) string {
	t.Helper()
	// Not t.TempDir(): its parents are 0700 root, which the postgres user
	// cannot traverse.
	dir, err := os.MkdirTemp("/tmp", prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func (p *PG) run(name string, args ...string) error {
	c := AsPostgres(filepath.Join(p.Bin, name), args...)
	if !isRoot() {
		c = exec.Command(filepath.Join(p.Bin, name), args...)
	}
	out, err := c.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

func chownPostgres(dir string) error {
	if !isRoot() {
		return nil
	}
	return exec.Command("chown", "-R", "postgres:postgres", dir).Run()
}

// conf appends settings to postgresql.auto.conf (read last, so they win over
// what pg_basebackup -R wrote there).
func (p *PG) conf(settings map[string]string) {
	p.t.Helper()
	var b strings.Builder
	for k, v := range settings {
		fmt.Fprintf(&b, "%s = '%s'\n", k, v)
	}
	f, err := os.OpenFile(filepath.Join(p.Dir, "postgresql.auto.conf"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		p.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(b.String()); err != nil {
		p.t.Fatal(err)
	}
}

// StartPG initdb's a fresh instance and starts it. extra settings go to its
// postgresql.conf.
func StartPG(t testing.TB, name string, extra map[string]string) *PG {
	t.Helper()
	bin := PGBin(t)
	base := baseDir(t, "chaos-pg-")
	p := &PG{t: t, Bin: bin, Dir: filepath.Join(base, name), Port: FreePort(t), Name: name}
	if err := os.Mkdir(p.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := chownPostgres(p.Dir); err != nil {
		t.Fatal(err)
	}
	if err := p.run("initdb", "-D", p.Dir, "-U", "bridge", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{
		"port": strconv.Itoa(p.Port), "listen_addresses": "127.0.0.1", "unix_socket_directories": p.Dir,
		"max_connections": "200", "fsync": "off", "full_page_writes": "off", "wal_level": "replica",
		"max_wal_senders": "5", "wal_keep_size": "256MB", "hot_standby": "on", "shared_buffers": "64MB",
		"log_min_messages": "warning",
	}
	for k, v := range extra {
		settings[k] = v
	}
	p.conf(settings)
	t.Cleanup(func() { _ = p.Stop("immediate") })
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	return p
}

// StartStandby makes a streaming standby of primary (pg_basebackup -R) named
// name, and starts it.
func StartStandby(t testing.TB, primary *PG, name string) *PG {
	t.Helper()
	base := filepath.Dir(primary.Dir)
	s := &PG{t: t, Bin: primary.Bin, Dir: filepath.Join(base, name), Port: FreePort(t), Name: name}
	if err := os.Mkdir(s.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := chownPostgres(s.Dir); err != nil {
		t.Fatal(err)
	}
	if err := s.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.Port), "-U", "bridge",
		"-D", s.Dir, "-R", "-X", "stream", "-c", "fast"); err != nil {
		t.Fatal(err)
	}
	s.conf(map[string]string{
		"port": strconv.Itoa(s.Port), "unix_socket_directories": s.Dir,
		// Copied from the primary by pg_basebackup: once promoted, this one
		// has no standby to wait for.
		"synchronous_standby_names": "",
		"primary_conninfo":          fmt.Sprintf("host=127.0.0.1 port=%d user=bridge application_name=%s", primary.Port, name),
	})
	t.Cleanup(func() { _ = s.Stop("immediate") })
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	return s
}

// Start starts the instance and waits until it accepts connections.
func (p *PG) Start() error {
	return p.run("pg_ctl", "-D", p.Dir, "-l", filepath.Join(p.Dir, "server.log"), "-w", "-t", "60", "start")
}

// Stop stops it with mode (smart, fast or immediate).
func (p *PG) Stop(mode string) error {
	if _, err := os.Stat(filepath.Join(p.Dir, "postmaster.pid")); err != nil {
		return nil
	}
	return p.run("pg_ctl", "-D", p.Dir, "-m", mode, "-w", "-t", "60", "stop")
}

// Promote turns a standby into a primary and waits for it.
func (p *PG) Promote() error { return p.run("pg_ctl", "-D", p.Dir, "-w", "-t", "60", "promote") }

// Log returns the tail of the server log (for failure messages).
func (p *PG) Log() string {
	b, _ := os.ReadFile(filepath.Join(p.Dir, "server.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// WaitReady polls until url answers or timeout passes.
func WaitReady(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := Ping(url)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// CreateDB creates database name on the server adminURL points to.
func CreateDB(adminURL, name string) error {
	return withConn(adminURL, 30*time.Second, func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		return err
	})
}
