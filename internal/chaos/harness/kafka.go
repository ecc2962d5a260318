package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/testkit"
)

// ServicesUp runs scripts/services-up.sh with env added and returns its output.
func ServicesUp(t testing.TB, env ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(RepoRoot(t), "scripts", "services-up.sh"))
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func needJava(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("java"); err != nil {
		testkit.Unavailable(t, "java (for the test's own Kafka brokers)", "`make services` (installs openjdk)", err)
	}
}

// Broker is a single-node Kafka of the test's own (scripts/services-up.sh
// with its own ports and state dir), so it can be killed and restarted.
type Broker struct {
	t      testing.TB
	State  string
	Port   int
	cport  int
	launch *launch
}

// Addr is its bootstrap address.
func (b *Broker) Addr() string { return fmt.Sprintf("127.0.0.1:%d", b.Port) }

func (b *Broker) env() []string {
	return []string{"SERVICES=kafka", "OUTBOX_BRIDGE_STATE=" + b.State,
		"KAFKA_PORT=" + strconv.Itoa(b.Port), "KAFKA_CONTROLLER_PORT=" + strconv.Itoa(b.cport)}
}

// StartBroker starts a broker of the test's own.
func StartBroker(t testing.TB) *Broker {
	t.Helper()
	b, err := StartBrokerAsync(t)()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// StartBrokerAsync begins starting a broker of the test's own in the
// background (a JVM start and services-up.sh's readiness check: the
// slowest part of a scenario's setup, so it overlaps the database's) and
// returns the wait for it. The wait must be called before the test ends.
func StartBrokerAsync(t testing.TB) func() (*Broker, error) {
	t.Helper()
	needJava(t)
	b := &Broker{t: t, State: baseDir(t, "chaos-kafka-"), Port: FreePort(t), cport: FreePort(t)}
	t.Cleanup(func() { harnessKill(b.pidfile()) })
	done := make(chan error, 1)
	go func() {
		out, err := ServicesUp(b.t, b.env()...)
		if err != nil {
			done <- fmt.Errorf("services-up.sh (kafka on %d): %v\n%s", b.Port, err, out)
			return
		}
		b.launch, err = captureLaunch(b.pidfile(), filepath.Join(b.State, "kafka", "logs", "kafka.out"))
		done <- err
	}()
	return sync.OnceValues(func() (*Broker, error) {
		if err := <-done; err != nil {
			return nil, err
		}
		return b, nil
	})
}

func (b *Broker) pidfile() string { return filepath.Join(b.State, "kafka", "kafka.pid") }

// Start starts it again (as services-up.sh did) and waits until it serves
// metadata.
func (b *Broker) Start() error {
	began := time.Now()
	if err := b.launch.start(); err != nil {
		return err
	}
	err := waitServing([]string{b.Addr()}, 1, brokerRestartWait)
	b.t.Logf("broker on %d serving again %.1fs after its restart (err %v)", b.Port, time.Since(began).Seconds(), err)
	return err
}

// brokerRestartWait bounds how long a broker (single or cluster node)
// restarted after kill -9 may take to serve again: it recovers its logs and
// replays the metadata log first. On 2 cores at load 5–45 that takes
// 28–72 s for the single broker and 20–72 s for a cluster node, and 98 s at
// load 60.
// 150 s is twice the worst seen without that overload. It is only how long a test waits before it fails:
// a fast restart costs nothing more. With the longest outage (20 s) it also
// stays under the processes' DATABASE_CONNECT_TIMEOUT (3 m), so a bridge
// process restarted during the outage is still waiting, not gone, when the
// broker is back.
const brokerRestartWait = 150 * time.Second

// Kill SIGKILLs it.
func (b *Broker) Kill() { harnessKill(b.pidfile()) }

func harnessKill(pidfile string) { KillPidFile(pidfile) }

// Cluster is the three-node cluster of scripts/services-up.sh
// SERVICES=kafka-cluster (started when it is not up).
type Cluster struct {
	t        testing.TB
	State    string
	Ports    []int
	launches map[int32]*launch
}

func cacheDir() string {
	if c := os.Getenv("OUTBOX_BRIDGE_CACHE"); c != "" {
		return c
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "outbox-bridge")
}

// LockFile takes an exclusive flock on name in the services cache dir until
// t ends, waiting for whoever holds it (another test process).
func LockFile(t testing.TB, name string) {
	t.Helper()
	if err := os.MkdirAll(cacheDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(cacheDir(), name), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Logf("waiting for %s (another test process uses the cluster)", f.Name())
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { f.Close() })
}

// ClusterPorts are the broker ports services-up.sh uses for the cluster.
var ClusterPorts = []int{19092, 19093, 19094}

// StartCluster makes sure the cluster runs (starting missing nodes) and that
// all three brokers are registered.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	needJava(t)
	cache := cacheDir()
	state := os.Getenv("OUTBOX_BRIDGE_STATE")
	if state == "" {
		state = filepath.Join(cache, "state")
	}
	c := &Cluster{t: t, State: filepath.Join(state, "kafka-cluster"), Ports: ClusterPorts, launches: map[int32]*launch{}}
	if err := c.Ensure(); err != nil {
		t.Fatal(err)
	}
	for n := int32(1); n <= 3; n++ {
		dir := filepath.Join(c.State, fmt.Sprintf("node-%d", n))
		l, err := captureLaunch(filepath.Join(dir, "kafka.pid"), filepath.Join(dir, "logs", "kafka.out"))
		if err != nil {
			t.Fatalf("cluster node %d: %v", n, err)
		}
		c.launches[n] = l
	}
	return c
}

// Restart starts node again (after Kill) and waits for three brokers.
func (c *Cluster) Restart(node int32) error {
	began := time.Now()
	if err := c.launches[node].start(); err != nil {
		return err
	}
	err := waitServing(c.Addrs(), 3, brokerRestartWait)
	c.t.Logf("cluster node %d registered again %.1fs after its restart (err %v)", node, time.Since(began).Seconds(), err)
	return err
}

// Addrs are the three bootstrap addresses.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, p := range c.Ports {
		out = append(out, fmt.Sprintf("127.0.0.1:%d", p))
	}
	return out
}

// Ensure starts whichever nodes are down and waits for three brokers.
func (c *Cluster) Ensure() error {
	out, err := ServicesUp(c.t, "SERVICES=kafka-cluster")
	if err != nil {
		return fmt.Errorf("services-up.sh kafka-cluster: %v\n%s", err, out)
	}
	return c.WaitBrokers(3, 90*time.Second)
}

// WaitBrokers waits until n brokers are in the cluster's metadata.
func (c *Cluster) WaitBrokers(n int, timeout time.Duration) error {
	return waitServing(c.Addrs(), n, timeout)
}

// Pid is node's process id (1..3), 0 when not running.
func (c *Cluster) Pid(node int32) int {
	b, err := os.ReadFile(filepath.Join(c.State, fmt.Sprintf("node-%d", node), "kafka.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 1 || syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

// Kill sends sig to node and, for SIGKILL or SIGTERM, waits for it to exit.
func (c *Cluster) Kill(node int32, sig syscall.Signal) error {
	pid := c.Pid(node)
	if pid == 0 {
		return fmt.Errorf("node %d is not running", node)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return err
	}
	// A controlled shutdown (SIGTERM) moves leadership away first: 10–16 s
	// measured at load 40–60; a minute before calling it stuck.
	if !WaitGone(pid, time.Minute) {
		return fmt.Errorf("node %d (pid %d) still running a minute after %v", node, pid, sig)
	}
	return nil
}

// launch is how a Kafka node was started (read from /proc before it is
// killed), so the test can start it again exactly so without another run of
// services-up.sh and its JVM-based readiness check.
type launch struct {
	argv []string
	env  []string
	dir  string
	log  string
	pidf string
}

func captureLaunch(pidfile, logfile string) (*launch, error) {
	b, err := os.ReadFile(pidfile)
	if err != nil {
		return nil, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, err
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, err
	}
	environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	l := &launch{argv: strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00"), dir: cwd, log: logfile, pidf: pidfile}
	if len(environ) > 0 {
		l.env = strings.Split(strings.TrimRight(string(environ), "\x00"), "\x00")
	}
	return l, nil
}

// start runs the node again, detached (its own session, stdin /dev/null,
// output appended to its log; Go passes no other descriptor).
func (l *launch) start() error {
	f, err := os.OpenFile(l.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	keepInheritedFDsFromChildren()
	cmd := exec.Command(l.argv[0], l.argv[1:]...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = l.env, l.dir, f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }() // reap it when it is killed
	return os.WriteFile(l.pidf, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)
}

// waitServing waits until addrs serve metadata with at least n brokers. A
// fresh client per try: one created while a node was down kept answering
// from a view without it.
func waitServing(addrs []string, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		got, err := brokerCount(addrs)
		if err == nil && got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%v: %d of %d brokers within %s (last error %v)", addrs, got, n, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func brokerCount(addrs []string) (int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	md, err := kadm.NewClient(cl).BrokerMetadata(ctx)
	return len(md.Brokers), err
}
