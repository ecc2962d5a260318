package outboxstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/pgtest"
)

// A relay idling on an empty outbox claims from it again and again; a
// prepared claim then gets a generic plan made for an empty table, in which
// each predecessor lookup is a sequential scan. When a burst lands, the first
// claim of 1,000 rows scanned the 100,000-row table once per asset: 15–24 s
// (the relay's lanes sat still meanwhile). With FreshPlan (what the relay
// asks for while the statistics describe a small table) the claim is planned
// for the table as it is; here it must take well under a second. The
// bound is loose on purpose (a slow CI machine): the failure is 15 s.
func TestClaimAfterABurstIsNotPlannedForAnEmptyTable(t *testing.T) {
	conn, p := idleOutbox(t)
	ctx := t.Context()
	p.FreshPlan = true
	for range 8 { // past PostgreSQL's 5 custom plans before a generic one
		if got, _, err := Claim(ctx, conn, p); err != nil || len(got) != 0 {
			t.Fatalf("claim on the empty table: %d rows, %v", len(got), err)
		}
	}
	if err := BenchFill(ctx, conn, 100000, "t", 1000, 300); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	got, _, err := Claim(ctx, conn, p)
	took := time.Since(started)
	if err != nil || len(got) != 1000 {
		t.Fatalf("claim after the burst: %d rows, %v", len(got), err)
	}
	if took > time.Second {
		t.Fatalf("claim of 1,000 rows after a 100,000-row burst took %s, want well under a second", took.Round(time.Millisecond))
	}
	t.Logf("claim after the burst: %s", took.Round(time.Millisecond))
}

// The streaming claim runs on a generic plan (GenericPlan, see
// genericPlanSQL). Its setting is the batch transaction's own: the pooled
// connection goes back with PostgreSQL's default, or every later statement on
// it would be planned generically. The claim after a burst, on a generic plan
// made while the table was empty, must still walk the index and stop at the
// batch (this PostgreSQL's generic plan is an index walk here; the relay
// still asks for it only on statistics of a large table).
func TestGenericPlanClaimLeavesTheSessionAlone(t *testing.T) {
	conn, p := idleOutbox(t)
	ctx := t.Context()
	p.GenericPlan = true
	if got, _, err := Claim(ctx, conn, p); err != nil || len(got) != 0 {
		t.Fatalf("claim on the empty table: %d rows, %v", len(got), err)
	}
	const burst = 30000
	if err := BenchFill(ctx, conn, burst, "t", 1000, 300); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	got, more, err := Claim(ctx, conn, p)
	took := time.Since(started)
	if err != nil || len(got) != 1000 || !more {
		t.Fatalf("claim after the burst: %d rows (more %v), %v", len(got), more, err)
	}
	for i, w := range got {
		if i > 0 && w.Seq <= got[i-1].Seq {
			t.Fatalf("claimed rows out of seq order at %d: %d after %d", i, w.Seq, got[i-1].Seq)
		}
	}
	if took > time.Second {
		t.Fatalf("generic-plan claim of 1,000 rows after a %d-row burst took %s, want well under a second", burst, took.Round(time.Millisecond))
	}
	var mode string
	if err := conn.QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if mode != "auto" {
		t.Fatalf("session after the claim: plan_cache_mode %s, want auto", mode)
	}
	t.Logf("generic-plan claim after the burst: %s", took.Round(time.Millisecond))
}

// idleOutbox returns a connection to a database of its own whose outbox is
// as an idle relay sees it: earlier events of 1,000 assets were sent and
// deleted by retention (so a burst's rows have predecessors to look up), the
// statistics are of an empty table, and every lane is leased to member "m";
// and the claim parameters for those lanes (a batch of 1,000 rows).
func idleOutbox(t *testing.T) (*pgx.Conn, ClaimParams) {
	t.Helper()
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	conn, err := pgx.ConnectConfig(ctx, db.Pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.WithoutCancel(ctx)) })
	if err := BenchFill(ctx, conn, 1000, "t", 1000, 300); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`DELETE FROM bridge.outbox`,
		`VACUUM ANALYZE bridge.outbox`,
		`UPDATE bridge.relay_lanes SET owner = 'm', expires_at = now() + interval '10 min'`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	lanes := make([]int, 64)
	for i := range lanes {
		lanes[i] = i
	}
	return conn, ClaimParams{Member: "m", Lanes: lanes, Margin: 15 * time.Second, Limit: 1000, MaxPayloadBytes: 1 << 20, BatchBytes: 16 << 20}
}
