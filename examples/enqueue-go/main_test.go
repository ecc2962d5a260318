package main

import (
	"context"
	"testing"

	"github.com/outboxbridge/bridge/internal/pgtest"
)

// The example runs as the README shows it, on a migrated database: the
// first run announces version 1, the second publishes 2 and expires 1, in
// that order, all NEW for the relay.
func TestEnqueueExampleWritesTheAnnouncedEvents(t *testing.T) {
	db := pgtest.New(t)
	t.Setenv("DATABASE_URL", db.URL)
	ctx := context.Background()
	for range 2 {
		if err := run(ctx, []string{"asset-42"}); err != nil {
			t.Fatal(err)
		}
	}
	got := pgtest.Column[string](t, db.Pool,
		`SELECT event_type || ' ' || payload::text || ' ' || status FROM bridge.outbox WHERE asset_id = 'asset-42' ORDER BY seq`)
	want := []string{
		`asset.version_published {"version": 1} NEW`,
		`asset.version_published {"version": 2} NEW`,
		`asset.version_expired {"version": 1} NEW`,
	}
	if len(got) != len(want) {
		t.Fatalf("outbox rows %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("outbox rows %q, want %q", got, want)
		}
	}
}

func TestEnqueueExampleNamesAMissingDatabaseURL(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	if err := run(context.Background(), nil); err == nil {
		t.Fatal("ran without DATABASE_URL")
	}
}
