package chaos

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/chaos/harness"
)

// servicesUp runs scripts/services-up.sh with env added, the given extra
// descriptors (fd 3, 4, …) and returns its combined output.
func servicesUp(t *testing.T, env []string, extra ...*os.File) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(harness.RepoRoot(t), "scripts", "services-up.sh"))
	cmd.Env = append(os.Environ(), env...)
	cmd.ExtraFiles = extra
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// dropCluster removes a Debian cluster a test created (stopping it first).
func dropCluster(t *testing.T, name string) {
	t.Helper()
	ver := harness.PGVersion(t)
	t.Cleanup(func() {
		_ = harness.AsRoot("pg_dropcluster", "--stop", ver, name).Run()
		// pg_dropcluster removes only the files pg_createcluster wrote: the
		// conf.d file services-up.sh adds kept /etc/postgresql/<ver>/<name>
		// behind, one directory per test run.
		_ = harness.AsRoot("rm", "-rf", filepath.Join("/etc/postgresql", ver, name)).Run()
	})
}

// holders returns the pids (among pids) that hold a descriptor pointing to
// target (a path, or "pipe:[inode]").
func holders(pids []int, target string) []int {
	var out []int
	for _, pid := range pids {
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, e := range ents {
			l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
			if err == nil && l == target {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

func pidsMatching(t *testing.T, substr string) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), substr) {
			out = append(out, pid)
		}
	}
	return out
}

// A lock file and a pipe held by the caller of services-up.sh must not stay
// held by the daemons it starts (PostgreSQL through pg_ctlcluster, Kafka):
// before, a flock'd file stayed locked for the daemons' lifetime and a reader
// of the caller's pipe never saw EOF.
func TestServicesUpClosesInheritedDescriptors(t *testing.T) {
	t.Parallel()
	harness.NeedDebianPostgres(t)
	state := t.TempDir()
	pgPort, kPort, kcPort := harness.FreePort(t), harness.FreePort(t), harness.FreePort(t)
	cluster := fmt.Sprintf("obfd%d", os.Getpid())
	dropCluster(t, cluster)

	lockPath := filepath.Join(t.TempDir(), "caller.lock")
	lock, err := os.Create(lockPath)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(pw.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	pipeName := fmt.Sprintf("pipe:[%d]", st.Ino)

	out, err := servicesUp(t, []string{
		"SERVICES=postgres kafka", "OUTBOX_BRIDGE_STATE=" + state,
		"PG_PORT=" + strconv.Itoa(pgPort), "PG_CLUSTER=" + cluster,
		"KAFKA_PORT=" + strconv.Itoa(kPort), "KAFKA_CONTROLLER_PORT=" + strconv.Itoa(kcPort),
	}, lock, pw)
	t.Cleanup(func() { harness.KillPidFile(filepath.Join(state, "kafka", "kafka.pid")) })
	if err != nil {
		t.Fatalf("services-up.sh: %v\n%s", err, out)
	}
	pw.Close()

	pg := pidsMatching(t, "/"+cluster)
	kafka := pidsMatching(t, filepath.Join(state, "kafka", "server.properties"))
	if len(pg) == 0 || len(kafka) == 0 {
		t.Fatalf("daemons not found (postgres %v, kafka %v)\n%s", pg, kafka, out)
	}
	daemons := append(pg, kafka...)
	if h := holders(daemons, lockPath); len(h) > 0 {
		t.Errorf("daemon pids %v hold the caller's lock file", h)
	}
	if h := holders(daemons, pipeName); len(h) > 0 {
		t.Errorf("daemon pids %v hold the caller's pipe", h)
	}
	// The pipe reaches EOF: nobody else holds its write end.
	done := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, pr); done <- err }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Error("the caller's pipe never reached EOF after services-up.sh exited")
	}
	// And the lock is free for someone else once the caller lets go.
	lock.Close()
	l2, _ := os.Open(lockPath)
	defer l2.Close()
	if err := syscall.Flock(int(l2.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Errorf("lock still held after the caller closed it: %v", err)
	}
}

// A server the script did not create is never changed: it prints what the
// server would need, leaves it alone and runs a cluster of its own, and
// --database-url follows that cluster.
func TestServicesUpLeavesForeignServerAlone(t *testing.T) {
	t.Parallel()
	harness.NeedDebianPostgres(t)
	ver := harness.PGVersion(t)
	state := t.TempDir()
	foreignPort, ownPort := harness.FreePort(t), harness.FreePort(t)
	foreign := fmt.Sprintf("obforeign%d", os.Getpid())
	own := fmt.Sprintf("obown%d", os.Getpid())
	dropCluster(t, foreign)
	dropCluster(t, own)
	// Someone else's cluster: created without the script, default
	// max_connections (100), a "bridge" role with another password.
	for _, args := range [][]string{
		{"pg_createcluster", ver, foreign, "--port", strconv.Itoa(foreignPort), "--start"},
	} {
		if out, err := harness.AsRoot(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	psql := func(sql string) string {
		out, err := harness.AsPostgres("psql", "-X", "-tA", "-p", strconv.Itoa(foreignPort), "-d", "postgres", "-c", sql).CombinedOutput()
		if err != nil {
			t.Fatalf("psql %q: %v\n%s", sql, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	psql(`CREATE ROLE bridge LOGIN PASSWORD 'theirs'`)
	beforeConn := psql(`SHOW max_connections`)
	beforeRole := psql(`SELECT rolsuper::text || ' ' || rolpassword FROM pg_authid WHERE rolname = 'bridge'`)
	beforePID := psql(`SELECT pg_postmaster_start_time()`)

	out, err := servicesUp(t, []string{
		"SERVICES=postgres", "OUTBOX_BRIDGE_STATE=" + state,
		"PG_PORT=" + strconv.Itoa(foreignPort), "PG_DEDICATED_PORT=" + strconv.Itoa(ownPort), "PG_CLUSTER=" + own,
	})
	if err != nil {
		t.Fatalf("services-up.sh: %v\n%s", err, out)
	}
	for _, want := range []string{"was not created by this script", "max_connections " + beforeConn + " -> 300", "ALTER ROLE bridge", "not changing it"} {
		if !strings.Contains(out, want) {
			t.Errorf("output does not say %q:\n%s", want, out)
		}
	}
	if got := psql(`SHOW max_connections`); got != beforeConn {
		t.Errorf("foreign max_connections changed: %s -> %s", beforeConn, got)
	}
	if got := psql(`SELECT rolsuper::text || ' ' || rolpassword FROM pg_authid WHERE rolname = 'bridge'`); got != beforeRole {
		t.Errorf("foreign role bridge changed")
	}
	if got := psql(`SELECT pg_postmaster_start_time()`); got != beforePID {
		t.Errorf("foreign server was restarted (%s -> %s)", beforePID, got)
	}
	cmd := exec.Command(filepath.Join(harness.RepoRoot(t), "scripts", "services-up.sh"), "--database-url")
	cmd.Env = append(os.Environ(), "OUTBOX_BRIDGE_STATE="+state)
	url, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("postgres://bridge:bridge@127.0.0.1:%d/bridge?sslmode=disable", ownPort)
	if strings.TrimSpace(string(url)) != want {
		t.Errorf("--database-url = %q, want %q", url, want)
	}
	if err := harness.Ping(want); err != nil {
		t.Errorf("dedicated cluster: %v", err)
	}
}

// Two services-up.sh at once must both succeed (before: "postmaster.pid
// already exists" from the second pg_ctlcluster start).
func TestServicesUpConcurrentRuns(t *testing.T) {
	t.Parallel()
	harness.NeedDebianPostgres(t)
	state := t.TempDir()
	port := harness.FreePort(t)
	cluster := fmt.Sprintf("obconc%d", os.Getpid())
	dropCluster(t, cluster)
	env := []string{"SERVICES=postgres", "OUTBOX_BRIDGE_STATE=" + state, "PG_PORT=" + strconv.Itoa(port), "PG_CLUSTER=" + cluster}
	var wg sync.WaitGroup
	outs := make([]string, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = servicesUp(t, env)
		}()
	}
	wg.Wait()
	waited := false
	for i := range 2 {
		if errs[i] != nil {
			t.Errorf("run %d: %v\n%s", i, errs[i], outs[i])
		}
		sc := bufio.NewScanner(strings.NewReader(outs[i]))
		for sc.Scan() {
			if strings.Contains(sc.Text(), "another services-up.sh is running") {
				waited = true
			}
		}
	}
	if !waited {
		t.Logf("neither run reported waiting (the first may have finished before the second started)")
	}
}
