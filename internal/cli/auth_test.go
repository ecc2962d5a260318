package cli

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/pgtest"
)

// A wrong database password is not an outage: a long-running command exits
// 1 at once with PostgreSQL's reason, instead of retrying it for
// DATABASE_CONNECT_TIMEOUT (3 minutes here). Not parallel: it sets the
// process environment the command reads.
func TestWrongPasswordExitsOneAtOnce(t *testing.T) {
	pgtest.Empty(t) // fails under CI=true when PostgreSQL is down
	u, err := url.Parse(pgtest.AdminURL())
	if err != nil || u.Host == "" {
		t.Fatalf("admin URL %q is not in URL form", pgtest.AdminURL())
	}
	u.User = url.UserPassword(u.User.Username(), "certainly-not-the-password")
	t.Setenv("DATABASE_URL", u.String())
	t.Setenv("DATABASE_CONNECT_TIMEOUT", "3m")
	t.Setenv("KAFKA_BROKERS", "127.0.0.1:1")
	t.Setenv("HTTP_ADDR", "off")
	began := time.Now()
	code, _, errOut := runBridge(t, "relay")
	if code != ExitRuntime || !strings.Contains(errOut, "password authentication failed") || !strings.Contains(errOut, "28P01") {
		t.Fatalf("exit %d, stderr %q; want 1 naming the password failure", code, errOut)
	}
	if took := time.Since(began); took > 15*time.Second {
		t.Errorf("took %s to give up on a wrong password, want at once", took)
	}
}
