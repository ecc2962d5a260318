package outboxstore

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/migrations"
)

// The upgrade to the log (migration 00230) keeps every unsent event: the old
// table's NEW rows become the log's first batch for every lane, in seq order
// and with their ids, seqs and asset_seqs; charged and FAILED rows keep their
// attempts in the held rows (with the NEW rows behind a charged one); SENT
// rows are not carried over, and numbering continues after them.
func TestUpgradeMovesUnsentRowsIntoTheLog(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	ctx := context.Background()
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS, goose.WithTableName("public."+database.MigrationsTable))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 220); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// A: 1 SENT, 2 NEW. B: 1 FAILED, 2 NEW. C: 1 charged NEW, 1 NEW behind it.
	for _, a := range []string{"A", "A", "A", "B", "B", "B", "C", "C"} {
		exec(`SELECT bridge.enqueue('t', $1, 'e', '{}')`, a)
	}
	exec(`UPDATE bridge.outbox SET status = 'SENT', sent_at = now() WHERE asset_id = 'A' AND asset_seq = 1`)
	exec(`UPDATE bridge.outbox SET status = 'FAILED', attempts = 10, failed_at = now(), last_error = 'x' WHERE asset_id = 'B' AND asset_seq = 1`)
	exec(`UPDATE bridge.outbox SET attempts = 2, next_attempt_at = now() + interval '1 hour', last_error = 'y' WHERE asset_id = 'C' AND asset_seq = 1`)
	var before []string
	rows, err := db.Pool.Query(ctx, `SELECT id::text || '/' || seq || '/' || asset_seq FROM bridge.outbox WHERE status = 'NEW' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		before = append(before, s)
	}
	rows.Close()

	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	var after []string
	rows, err = db.Pool.Query(ctx, `SELECT id::text || '/' || seq || '/' || asset_seq FROM bridge.outbox_log ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		after = append(after, s)
	}
	rows.Close()
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("log after the upgrade %v, want the old NEW rows %v", after, before)
	}
	var held string
	if err := db.Pool.QueryRow(ctx, `SELECT string_agg(asset_id || asset_seq || ':' || status || ':' || attempts, ',' ORDER BY asset_id, asset_seq)
FROM bridge.outbox_held`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != "B1:FAILED:10,C1:NEW:2,C2:NEW:0" {
		t.Fatalf("held after the upgrade: %s", held)
	}
	// Every lane has the moved rows ahead of it: they are NEW in the view.
	var news int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.outbox WHERE status = 'NEW'`).Scan(&news); err != nil || news != 6 {
		t.Fatalf("NEW events after the upgrade: %d, %v; want 6", news, err)
	}
	var a int64
	if err := db.Pool.QueryRow(ctx, `SELECT bridge.enqueue('t', 'A', 'e', '{}')`).Scan(new(string)); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT max(asset_seq) FROM bridge.outbox_log WHERE asset_id = 'A'`).Scan(&a); err != nil || a != 4 {
		t.Fatalf("A's next event after the upgrade: asset_seq %d, %v; want 4", a, err)
	}
}
