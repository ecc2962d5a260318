package servicesup

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// script is scripts/services-up.sh, from this package's directory.
func script(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", "scripts", "services-up.sh"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// needDebianPostgres skips (fails under CI=true) unless the Debian
// PostgreSQL tools are installed and this process may create clusters.
func needDebianPostgres(t *testing.T) string {
	t.Helper()
	missing := func(why string) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("services-up decision tests need %s (CI=true)", why)
		}
		t.Skipf("services-up decision tests need %s", why)
	}
	for _, c := range []string{"pg_createcluster", "pg_dropcluster", "pg_ctlcluster", "pg_lsclusters", "psql"} {
		if _, err := exec.LookPath(c); err != nil {
			missing("Debian's PostgreSQL (" + c + ")")
		}
	}
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("sudo"); err != nil {
			missing("root or sudo (pg_createcluster)")
		}
	}
	vers, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(vers) == 0 {
		missing("a PostgreSQL server under /usr/lib/postgresql")
	}
	sort.Slice(vers, func(i, j int) bool { return pgMajor(vers[i]) < pgMajor(vers[j]) })
	return strconv.Itoa(pgMajor(vers[len(vers)-1]))
}

func pgMajor(bin string) int {
	v, _ := strconv.Atoi(strings.Split(strings.TrimPrefix(bin, "/usr/lib/postgresql/"), "/")[0])
	return v
}

func asRoot(args ...string) []string {
	if os.Geteuid() == 0 {
		return args
	}
	return append([]string{"sudo"}, args...)
}

func run(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// freePorts returns n loopback ports nothing listens on and no Debian
// cluster is configured on.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	configured := run(t, "pg_lsclusters", "-h")
	var ports []int
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
		p := l.Addr().(*net.TCPAddr).Port
		taken := false
		for _, line := range strings.Split(configured, "\n") {
			if f := strings.Fields(line); len(f) > 2 && f[2] == strconv.Itoa(p) {
				taken = true
			}
		}
		if !taken {
			ports = append(ports, p)
		}
	}
	return ports
}

var seq atomic.Int32

// cluster is a Debian cluster this test created; Cleanup drops it.
type cluster struct {
	ver, name string
	port      int
}

// uniqueName is a cluster name no one else uses: this process, a counter.
func uniqueName(what string) string {
	return fmt.Sprintf("obtest-%s-%d-%d", what, os.Getpid(), seq.Add(1))
}

// createCluster creates (and with start, starts) a cluster of the test's
// own with start.conf manual, so that nothing but the test starts it.
func createCluster(t *testing.T, ver, what string, port int, start bool, opts ...string) cluster {
	t.Helper()
	c := cluster{ver: ver, name: uniqueName(what), port: port}
	args := []string{"pg_createcluster", ver, c.name, "--port", strconv.Itoa(port), "--start-conf=manual"}
	for _, o := range opts {
		args = append(args, "-o", o)
	}
	run(t, asRoot(args...)...)
	dropOnCleanup(t, c)
	if start {
		run(t, asRoot("pg_ctlcluster", ver, c.name, "start")...)
	}
	return c
}

// dropOnCleanup drops c (stopping it first) when the test ends. Only names
// this process made are ever dropped.
func dropOnCleanup(t *testing.T, c cluster) {
	t.Helper()
	if !strings.HasPrefix(c.name, "obtest-") || !strings.Contains(c.name, fmt.Sprintf("-%d-", os.Getpid())) {
		t.Fatalf("refusing to schedule the drop of cluster %s: not created by this test", c.name)
	}
	t.Cleanup(func() {
		if status(t, c.ver, c.name) == "" {
			return // expected of the script, and not created
		}
		drop := asRoot("pg_dropcluster", "--stop", c.ver, c.name)
		cmd := exec.Command(drop[0], drop[1:]...)
		cmd.Dir = "/"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("pg_dropcluster %s/%s: %v\n%s", c.ver, c.name, err, out)
		}
	})
}

// status is the cluster's pg_lsclusters status ("online", "down"), "" when
// it does not exist.
func status(t *testing.T, ver, name string) string {
	t.Helper()
	for _, line := range strings.Split(run(t, "pg_lsclusters", "-h"), "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[0] == ver && f[1] == name {
			return f[3]
		}
	}
	return ""
}

func marker(ver, name string) string {
	return filepath.Join("/etc/postgresql", ver, name, "conf.d", "outbox-bridge.conf")
}

func psqlAsPostgres(t *testing.T, port int, sql string) string {
	t.Helper()
	args := []string{"psql", "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", "-p", strconv.Itoa(port), "-d", "postgres", "-c", sql}
	if os.Geteuid() == 0 {
		args = append([]string{"runuser", "-u", "postgres", "--"}, args...)
	} else {
		args = append([]string{"sudo", "-u", "postgres"}, args...)
	}
	return strings.TrimSpace(run(t, args...))
}

// servicesUp runs the script for PostgreSQL only with a scratch state and
// cache (so its lock is not the shared services' lock), PG_PORT and
// PG_DEDICATED_PORT on the test's ports and PG_CLUSTER a name of the test's.
// It returns the combined output, the URL `--database-url` prints
// afterwards, and the run's error.
type upRun struct {
	state, cache string
	env          []string
}

func newRun(t *testing.T, pgPort, dedicatedPort int, ownName string, extra ...string) *upRun {
	t.Helper()
	r := &upRun{state: t.TempDir(), cache: t.TempDir()}
	r.env = append(os.Environ(),
		"SERVICES=postgres",
		"OUTBOX_BRIDGE_STATE="+r.state,
		"OUTBOX_BRIDGE_CACHE="+r.cache,
		"PG_PORT="+strconv.Itoa(pgPort),
		"PG_DEDICATED_PORT="+strconv.Itoa(dedicatedPort),
		"PG_CLUSTER="+ownName,
		"PG_ADOPT=no",
	)
	r.env = append(r.env, extra...)
	return r
}

func (r *upRun) up(t *testing.T, env ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script(t))
	cmd.Env = append(append([]string{}, r.env...), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func (r *upRun) url(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("bash", script(t), "--database-url")
	cmd.Env = r.env
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("services-up.sh --database-url: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func urlOn(port int) string {
	return fmt.Sprintf("postgres://bridge:bridge@127.0.0.1:%d/bridge?sslmode=disable", port)
}

// canLogIn: the bridge role logs in to the URL and runs a query.
func canLogIn(t *testing.T, url string) {
	t.Helper()
	cmd := exec.Command("psql", "-X", "-q", "-tAc", "SELECT 1", url)
	cmd.Env = append(os.Environ(), "PGPASSWORD=bridge", "PGCONNECT_TIMEOUT=10")
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Fatalf("psql %s: %v\n%s", url, err, out)
	}
}

// ownCluster registers the cluster the script is expected to create as the
// test's to drop, before the script runs (a failed run still cleans up).
func ownCluster(t *testing.T, ver string, port int) cluster {
	c := cluster{ver: ver, name: uniqueName("own"), port: port}
	dropOnCleanup(t, c)
	return c
}

// Installed but stopped (a Debian machine's default: the package's cluster
// exists, nobody started it): the script leaves the stopped cluster alone —
// not started, not marked — runs a cluster of its own on the dedicated
// port and records that URL; a second run (a fresh state directory too)
// reuses its cluster.
func TestServicesUpInstalledButStoppedClusterIsLeftAlone(t *testing.T) {
	ver := needDebianPostgres(t)
	ports := freePorts(t, 2)
	stopped := createCluster(t, ver, "stopped", ports[0], false)
	own := ownCluster(t, ver, ports[1])

	r := newRun(t, ports[0], ports[1], own.name)
	out, err := r.up(t)
	if err != nil {
		t.Fatalf("services-up.sh: %v\n%s", err, out)
	}
	if !strings.Contains(out, "was not created by this script and is not running: leaving it alone") {
		t.Errorf("no word of leaving the stopped cluster alone:\n%s", out)
	}
	if s := status(t, ver, stopped.name); s != "down" {
		t.Errorf("the stopped cluster is %q after the run; the script must not start it", s)
	}
	if _, err := os.Stat(marker(ver, stopped.name)); !os.IsNotExist(err) {
		t.Errorf("the stopped cluster got the script's marker file (%v)", err)
	}
	if s := status(t, ver, own.name); !strings.HasPrefix(s, "online") {
		t.Fatalf("own cluster %s is %q, want online:\n%s", own.name, s, out)
	}
	if _, err := os.Stat(marker(ver, own.name)); err != nil {
		t.Errorf("own cluster has no marker file: %v", err)
	}
	if got := r.url(t); got != urlOn(ports[1]) {
		t.Fatalf("--database-url printed %q, want %q", got, urlOn(ports[1]))
	}
	canLogIn(t, urlOn(ports[1]))

	// Second run, and a run from a fresh state directory: same decision,
	// no new cluster, same URL.
	out2, err := r.up(t)
	if err != nil {
		t.Fatalf("second run: %v\n%s", err, out2)
	}
	if strings.Contains(out2, "creating PostgreSQL") {
		t.Errorf("second run created a cluster again:\n%s", out2)
	}
	fresh := newRun(t, ports[0], ports[1], own.name)
	out3, err := fresh.up(t)
	if err != nil {
		t.Fatalf("run with a fresh state: %v\n%s", err, out3)
	}
	if strings.Contains(out3, "creating PostgreSQL") {
		t.Errorf("a fresh state directory created a cluster again:\n%s", out3)
	}
	if got := fresh.url(t); got != urlOn(ports[1]) {
		t.Fatalf("fresh state: --database-url printed %q, want %q", got, urlOn(ports[1]))
	}
	if s := status(t, ver, stopped.name); s != "down" {
		t.Errorf("the stopped cluster is %q after three runs", s)
	}
}

// Running and adoptable: a server someone else runs on which role bridge
// logs in as superuser and max_connections is high enough is used as it
// is: its URL is recorded, no cluster is created, nothing on it changes.
func TestServicesUpRunningAdoptableServerIsUsedUnchanged(t *testing.T) {
	ver := needDebianPostgres(t)
	ports := freePorts(t, 2)
	theirs := createCluster(t, ver, "adoptable", ports[0], true, "max_connections=300")
	psqlAsPostgres(t, theirs.port, "CREATE ROLE bridge LOGIN SUPERUSER PASSWORD 'bridge'")
	psqlAsPostgres(t, theirs.port, "CREATE DATABASE bridge OWNER bridge")
	own := ownCluster(t, ver, ports[1])

	r := newRun(t, ports[0], ports[1], own.name)
	out, err := r.up(t)
	if err != nil {
		t.Fatalf("services-up.sh: %v\n%s", err, out)
	}
	if !strings.Contains(out, "using it unchanged") {
		t.Errorf("no word of using the server unchanged:\n%s", out)
	}
	if got := r.url(t); got != urlOn(ports[0]) {
		t.Fatalf("--database-url printed %q, want the adoptable server's %q", got, urlOn(ports[0]))
	}
	if s := status(t, ver, own.name); s != "" {
		t.Errorf("a cluster of the script's own exists (%q) although the running server was usable", s)
	}
	if _, err := os.Stat(marker(ver, theirs.name)); !os.IsNotExist(err) {
		t.Errorf("the adopted server got the script's marker file (%v): it is not the script's", err)
	}
	if got := psqlAsPostgres(t, theirs.port, "SHOW shared_buffers"); got == "1GB" {
		t.Errorf("the adopted server's shared_buffers became the script's own setting")
	}
}

// Running and someone else's: a server on which role bridge does not exist
// is not changed (no role, no database created); the script prints what it
// would need, runs a cluster of its own on the dedicated port and records
// that URL.
func TestServicesUpRunningForeignServerIsNotChanged(t *testing.T) {
	ver := needDebianPostgres(t)
	ports := freePorts(t, 2)
	theirs := createCluster(t, ver, "foreign", ports[0], true)
	own := ownCluster(t, ver, ports[1])

	r := newRun(t, ports[0], ports[1], own.name)
	out, err := r.up(t)
	if err != nil {
		t.Fatalf("services-up.sh: %v\n%s", err, out)
	}
	for _, want := range []string{"CREATE ROLE bridge", "not changing it", "PG_ADOPT=yes"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if got := psqlAsPostgres(t, theirs.port, "SELECT count(*) FROM pg_roles WHERE rolname = 'bridge'"); got != "0" {
		t.Errorf("the foreign server got a bridge role")
	}
	if got := psqlAsPostgres(t, theirs.port, "SELECT count(*) FROM pg_database WHERE datname = 'bridge'"); got != "0" {
		t.Errorf("the foreign server got a bridge database")
	}
	if s := status(t, ver, theirs.name); !strings.HasPrefix(s, "online") {
		t.Errorf("the foreign server is %q after the run; it must keep running", s)
	}
	if got := r.url(t); got != urlOn(ports[1]) {
		t.Fatalf("--database-url printed %q, want the own cluster's %q", got, urlOn(ports[1]))
	}
	canLogIn(t, urlOn(ports[1]))
}

// A listener that is not a Debian cluster at all (another PostgreSQL
// installation, a container, anything) counts as someone else's: the
// script does not try to log in to it as postgres and runs its own cluster.
// When the dedicated port is taken by something else too, the script stops
// with an error naming PG_DEDICATED_PORT instead of touching either.
func TestServicesUpForeignListenerAndTakenDedicatedPort(t *testing.T) {
	ver := needDebianPostgres(t)
	ports := freePorts(t, 2)
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	blocker, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[1]))
	if err != nil {
		t.Fatal(err)
	}
	own := ownCluster(t, ver, ports[1])
	r := newRun(t, ports[0], ports[1], own.name)
	out, err := r.up(t)
	if err == nil {
		t.Fatalf("services-up.sh succeeded with both ports taken by strangers:\n%s", out)
	}
	if !strings.Contains(out, "PG_DEDICATED_PORT") {
		t.Errorf("the error does not name PG_DEDICATED_PORT:\n%s", out)
	}
	if s := status(t, ver, own.name); s != "" {
		t.Errorf("a cluster was created (%q) on a port someone else holds", s)
	}
	if _, err := os.Stat(filepath.Join(r.state, "database_url")); !os.IsNotExist(err) {
		t.Errorf("a URL was recorded although the run failed (%v)", err)
	}

	blocker.Close()
	out, err = r.up(t)
	if err != nil {
		t.Fatalf("services-up.sh with a free dedicated port: %v\n%s", err, out)
	}
	if !strings.Contains(out, "log in as bridge/bridge, which fails") {
		t.Errorf("no word of the failed login on the foreign listener:\n%s", out)
	}
	if got := r.url(t); got != urlOn(ports[1]) {
		t.Fatalf("--database-url printed %q, want %q", got, urlOn(ports[1]))
	}
}

// PostgreSQL absent: the script installs the Debian package. Removing
// PostgreSQL from a shared machine is not something a test may do, so this
// runs the script with a PATH on which pg_ctlcluster does not exist and
// apt-get is a stand-in that records its arguments and fails: the decision
// (install postgresql with apt-get, stop with an error when that fails,
// record no URL) is checked; the installation itself is apt's, and what
// follows it (Debian's package creates <version>/main on 5432, which the
// script then treats as its own) is not exercised here.
func TestServicesUpInstallsPostgresWhenAbsent(t *testing.T) {
	bin := t.TempDir()
	record := filepath.Join(t.TempDir(), "apt-get.args")
	fake := "#!/bin/sh\necho \"$*\" >>" + record + "\nexit 100\n"
	if err := os.WriteFile(filepath.Join(bin, "apt-get"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	// The tools the script uses up to its install decision, and nothing of
	// PostgreSQL's.
	for _, c := range []string{"bash", "cat", "mkdir", "flock", "env", "id", "dirname", "sudo", "timeout", "awk", "mv"} {
		p, err := exec.LookPath(c)
		if err != nil {
			continue
		}
		if err := os.Symlink(p, filepath.Join(bin, c)); err != nil {
			t.Fatal(err)
		}
	}
	state, cache := t.TempDir(), t.TempDir()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bash, script(t))
	cmd.Env = []string{
		"PATH=" + bin, "HOME=" + cache, "SERVICES=postgres",
		"OUTBOX_BRIDGE_STATE=" + state, "OUTBOX_BRIDGE_CACHE=" + cache,
		// Ports no server of anyone's is on, should the script get past
		// its install decision.
		"PG_PORT=1", "PG_DEDICATED_PORT=2", "PG_CLUSTER=" + uniqueName("absent"),
	}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("services-up.sh succeeded without PostgreSQL and with apt-get failing:\n%s", out)
	}
	args, rerr := os.ReadFile(record)
	if rerr != nil {
		t.Fatalf("apt-get was not called: %v\n%s", rerr, out)
	}
	if !strings.Contains(string(out), "installing postgresql with apt-get") {
		t.Errorf("no word of installing postgresql:\n%s", out)
	}
	if !strings.Contains(string(args), "update") {
		t.Errorf("apt-get called with %q, want an update before the install", args)
	}
	if _, err := os.Stat(filepath.Join(state, "database_url")); !os.IsNotExist(err) {
		t.Errorf("a URL was recorded although PostgreSQL could not be installed (%v)", err)
	}

}
