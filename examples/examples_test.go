package examples

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/outboxbridge/bridge/internal/pgtest"
)

// The plain-SQL example runs through psql as the README shows it, on a
// migrated database, and leaves its event NEW in bridge.outbox.
func TestEnqueueSQLExample(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("psql is needed for the SQL example (CI=true)")
		}
		t.Skip("psql is needed for the SQL example")
	}
	db := pgtest.New(t)
	for range 2 {
		out, err := exec.Command(psql, db.URL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "asset=asset-7",
			"-f", "enqueue-sql/enqueue.sql").CombinedOutput()
		if err != nil {
			t.Fatalf("psql -f enqueue-sql/enqueue.sql: %v\n%s", err, out)
		}
	}
	got := pgtest.Column[string](t, db.Pool,
		`SELECT event_type || ' ' || payload::text || ' ' || status FROM bridge.outbox WHERE asset_id = 'asset-7' ORDER BY seq`)
	want := `asset.version_published {"version": 1} NEW|asset.version_published {"version": 2} NEW`
	if strings.Join(got, "|") != want {
		t.Fatalf("outbox rows %q, want %q", got, want)
	}
}
