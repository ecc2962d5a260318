package cli

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/keyring/keyringtest"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// freeAddr returns a loopback address nothing listens on (yet).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// forward listens on addr and forwards every connection to target, until
// the test ends: a dependency that comes up at a chosen moment.
func forward(t *testing.T, addr, target string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	serveTCP(t, ln, func(c net.Conn, wg *sync.WaitGroup) []net.Conn {
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			return nil
		}
		wg.Go(func() { _, _ = io.Copy(up, c); up.Close() })
		wg.Go(func() { _, _ = io.Copy(c, up); c.Close() })
		return []net.Conn{c, up}
	})
}

// serveTCP accepts on ln until the test ends and hands each connection to
// handle, which may start goroutines on wg and returns the connections to
// close at the end. Then the listener and those connections are closed and
// every goroutine is waited for, so nothing outlives the test.
func serveTCP(t *testing.T, ln net.Listener, handle func(c net.Conn, wg *sync.WaitGroup) []net.Conn) {
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			open := handle(c, &wg)
			mu.Lock()
			conns = append(conns, open...)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

func httpStatus(url string) (int, string) {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestLongRunningCommandsWaitForPostgreSQLAndKafka starts each long-running
// command while nothing listens at its PostgreSQL (and Kafka) address: it
// must keep running and retrying, with /healthz up and /readyz not ready,
// then become ready once the dependencies appear (a listener forwarding to
// the real services), and still stop cleanly on SIGTERM.
func TestLongRunningCommandsWaitForPostgreSQLAndKafka(t *testing.T) {
	t.Parallel()
	realKafka := kafkatest.RealBrokers(t)[0]
	for _, tc := range []struct {
		name, command string
		kafka         bool
		env           []string
	}{
		{"relay", "relay", true, nil},
		{"consume", "consume", true, []string{"WEBHOOK_FAST_LANE=false"}},
		// The fast lane (the default) reads the topics: it waits for
		// Kafka too; the row engine's deliverer needs only PostgreSQL.
		{"deliver", "deliver", true, nil},
		{"deliver row engine", "deliver", false, []string{"WEBHOOK_FAST_LANE=false"}},
		{"run", "run", true, nil},
		{"run row engine", "run", true, []string{"WEBHOOK_FAST_LANE=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := pgtest.NewParallel(t)
			ctx := t.Context()
			u, err := url.Parse(db.URL)
			if err != nil {
				t.Fatal(err)
			}
			realPG := u.Host
			pgAddr, kafkaAddr, httpAddr := freeAddr(t), freeAddr(t), freeAddr(t)
			u.Host = pgAddr
			env := []string{
				"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(),
				"DATABASE_URL=" + u.String(),
				"DATABASE_CONNECT_TIMEOUT=2m",
				"HTTP_ADDR=" + httpAddr,
				"KAFKA_BROKERS=" + kafkaAddr,
				"CONSUMER_TOPICS=" + kafkatest.TopicName(t),
				"CONSUMER_GROUP=" + kafkatest.TopicName(t),
				"LOG_FORMAT=json",
				"BRIDGE_SECRET_KEYS=" + keyringtest.Keys,
			}
			env = append(env, tc.env...)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bridgeBinary(t), tc.command)
			cmd.Env = env
			logs := &testkit.LogBuffer{}
			cmd.Stdout, cmd.Stderr = logs, logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-exited
			})
			alive := func() string {
				select {
				case err := <-exited:
					exited <- err
					return "exited: " + errString(err) + "\n" + logs.String()
				default:
					return ""
				}
			}
			base := "http://" + httpAddr

			// Up and alive, not ready, retrying (the log says so once).
			testkit.Eventually(t, 30*time.Second, func() string {
				if m := alive(); m != "" {
					t.Fatal(m)
				}
				code, body := httpStatus(base + "/healthz")
				return testkit.Unless(code == http.StatusOK, "/healthz: %d %s", code, body)
			})
			testkit.Eventually(t, 30*time.Second, func() string {
				return testkit.Unless(strings.Contains(logs.String(), "connect to PostgreSQL at "+pgAddr+" failed; retrying"), "no retry logged yet:\n%s", logs.String())
			})
			if code, body := httpStatus(base + "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "postgres") {
				t.Fatalf("/readyz while PostgreSQL is unreachable: %d %s", code, body)
			}

			forward(t, pgAddr, realPG)
			if tc.kafka {
				// PostgreSQL is back; the command now waits for Kafka.
				testkit.Eventually(t, 30*time.Second, func() string {
					return testkit.Unless(strings.Contains(logs.String(), "connect to Kafka at "+kafkaAddr+" failed; retrying"), "no Kafka retry logged yet:\n%s", logs.String())
				})
				if code, body := httpStatus(base + "/readyz"); code != http.StatusServiceUnavailable {
					t.Fatalf("/readyz while Kafka is unreachable: %d %s", code, body)
				}
				forward(t, kafkaAddr, realKafka)
			}
			testkit.Eventually(t, 60*time.Second, func() string {
				if m := alive(); m != "" {
					t.Fatal(m)
				}
				code, body := httpStatus(base + "/readyz")
				return testkit.Unless(code == http.StatusOK, "/readyz: %d %s", code, body)
			})
			if n := strings.Count(logs.String(), "connect to PostgreSQL at "+pgAddr+" failed; retrying"); n > 3 {
				t.Errorf("the same failure was logged %d times; want once per interval", n)
			}

			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				exited <- err
				if err != nil {
					t.Fatalf("exit after SIGTERM: %v\n%s", err, logs.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("no exit within 30s of SIGTERM\n%s", logs.String())
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

// TestLongRunningCommandGivesUpAfterTheConnectTimeout: with nothing ever
// listening, `bridge consume` exits 1 once DATABASE_CONNECT_TIMEOUT has
// passed (not before), naming the address; an operator command with the
// default timeout (minutes) still fails at once.
func TestLongRunningCommandGivesUpAfterTheConnectTimeout(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	dsn := "postgres://bridge:" + dbPassword + "@" + addr + "/bridge?sslmode=disable"
	r := bridge(t, map[string]string{
		"DATABASE_URL": dsn, "DATABASE_CONNECT_TIMEOUT": "3s", "HTTP_ADDR": "off",
		"KAFKA_BROKERS": "127.0.0.1:1", "CONSUMER_TOPICS": "t", "LOG_LEVEL": "error", "WEBHOOK_FAST_LANE": "false",
	}, "consume")
	if r.code != ExitRuntime || r.elapsed < 3*time.Second || r.elapsed > 15*time.Second {
		t.Fatalf("exit %d after %v, want 1 after about 3s\nstderr: %s", r.code, r.elapsed, r.stderr)
	}
	if !strings.Contains(r.stderr, "cannot connect to PostgreSQL at "+addr) || strings.Contains(r.stderr, dbPassword) {
		t.Errorf("stderr %q", r.stderr)
	}

	r = bridge(t, map[string]string{"DATABASE_URL": dsn}, "outbox", "stats")
	if r.code != ExitRuntime || r.elapsed > 5*time.Second {
		t.Fatalf("bridge outbox stats: exit %d after %v, want 1 at once (operator commands do not wait)\nstderr: %s", r.code, r.elapsed, r.stderr)
	}
	requireConnectFailure(t, r, addr, 2*time.Second)
}
