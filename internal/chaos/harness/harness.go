// Package harness runs the pieces a fault test needs as real processes on
// loopback: a PostgreSQL instance of the test's own (initdb + pg_ctl from
// Debian's binaries, own port and directory, so the shared server is never
// restarted), Kafka brokers started through scripts/services-up.sh on ports
// of their own, the built bridge binary as supervised subprocesses that can be
// SIGKILLed, and a webhook receiver that logs each request before answering.
package harness

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/testkit"
)

// RepoRoot is the repository's top directory (where go.mod is).
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the harness source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// PGVersion is the highest PostgreSQL server version under /usr/lib/postgresql.
func PGVersion(t testing.TB) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	var vers []int
	for _, d := range dirs {
		v, err := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(d))))
		if err == nil {
			vers = append(vers, v)
		}
	}
	if len(vers) == 0 {
		testkit.Unavailable(t, "PostgreSQL server binaries (/usr/lib/postgresql/*/bin)", "`make services` (installs the postgresql package)", fmt.Errorf("none found"))
	}
	sort.Ints(vers)
	return strconv.Itoa(vers[len(vers)-1])
}

// PGBin is the directory of that version's binaries (initdb, pg_ctl, …).
func PGBin(t testing.TB) string { return filepath.Join("/usr/lib/postgresql", PGVersion(t), "bin") }

func isRoot() bool { return os.Geteuid() == 0 }

// AsRoot runs name as root (directly when we are root, else through sudo -n).
func AsRoot(name string, args ...string) *exec.Cmd {
	if isRoot() {
		return exec.Command(name, args...)
	}
	return exec.Command("sudo", append([]string{"-n", name}, args...)...)
}

// AsPostgres runs name as the postgres OS user (PostgreSQL refuses to run as
// root), from / so nothing complains about an unreadable cwd.
func AsPostgres(name string, args ...string) *exec.Cmd {
	var c *exec.Cmd
	switch {
	case isRoot():
		c = exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
	default:
		c = exec.Command("sudo", append([]string{"-n", "-u", "postgres", name}, args...)...)
	}
	c.Dir = "/"
	return c
}

// NeedDebianPostgres fails (CI) or skips the test unless Debian's PostgreSQL
// cluster tools are installed and usable as root.
func NeedDebianPostgres(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("pg_createcluster"); err != nil {
		testkit.Unavailable(t, "Debian's PostgreSQL tools (pg_createcluster)", "`make services`", err)
	}
	if !isRoot() {
		if err := exec.Command("sudo", "-n", "true").Run(); err != nil {
			testkit.Unavailable(t, "root (sudo -n) for pg_createcluster", "a user with passwordless sudo", err)
		}
	}
	PGVersion(t)
}

// FreePort returns a loopback TCP port nobody listens on right now.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// KillPidFile SIGKILLs the process in pidfile, if any, and waits for it to go.
func KillPidFile(pidfile string) {
	b, err := os.ReadFile(pidfile)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	WaitGone(pid, 10*time.Second)
}

// WaitGone waits until pid no longer exists (or is a zombie).
func WaitGone(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		// Field 3 is the state; Z = zombie (gone for our purposes).
		if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// Ping connects to url once.
func Ping(url string) error {
	return withConn(url, 5*time.Second, func(ctx context.Context, c *pgx.Conn) error { return c.Ping(ctx) })
}

// withConn runs do on a connection to url, all of it within timeout.
func withConn(url string, timeout time.Duration, do func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return do(ctx, c)
}
