// Command enqueue-go is the smallest application that publishes through
// Outbox Bridge: it changes a row of its own and enqueues the events that
// announce the change in the same transaction, so the events exist exactly
// when the change does.
//
//	DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable \
//	  go run ./examples/enqueue-go asset-42
//
// The database must be migrated (bridge migrate; make demo does it). The
// events wait in bridge.outbox as NEW until a relay sends them to Kafka:
// bridge outbox stats shows them.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/outbox"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "enqueue-go:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return fmt.Errorf("DATABASE_URL is not set (e.g. postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable)")
	}
	asset := "asset-42"
	if len(args) > 0 {
		asset = args[0]
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()

	// The application's own table, here only so the example has a change
	// to announce.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_assets (
		id text PRIMARY KEY, version int NOT NULL)`); err != nil {
		return err
	}

	var ids []string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var version int
		if err := tx.QueryRow(ctx, `INSERT INTO example_assets (id, version) VALUES ($1, 1)
			ON CONFLICT (id) DO UPDATE SET version = example_assets.version + 1
			RETURNING version`, asset).Scan(&version); err != nil {
			return err
		}
		events := []outbox.Event{{
			Topic: "assets", AssetID: asset, EventType: "asset.version_published",
			Payload: json.RawMessage(fmt.Sprintf(`{"version": %d}`, version)),
		}}
		if version > 1 {
			events = append(events, outbox.Event{
				Topic: "assets", AssetID: asset, EventType: "asset.version_expired",
				Payload: json.RawMessage(fmt.Sprintf(`{"version": %d}`, version-1)),
			})
		}
		// One call for the transaction's events: their order is kept, and
		// the asset's lock is taken once.
		got, err := outbox.EnqueueBatch(ctx, tx, events)
		for _, id := range got {
			ids = append(ids, id.String())
		}
		return err
	})
	if err != nil {
		return err
	}
	for _, id := range ids {
		fmt.Println("enqueued", id)
	}
	return nil
}
