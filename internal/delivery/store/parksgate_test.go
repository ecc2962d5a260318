package store

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// openStreamsWithoutMarker counts the streams that have an open delivery and
// no park marker: once the fast lane can read the markers, always 0.
func (b *testBundle) openStreamsWithoutMarker(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), `
SELECT count(*) FROM (
  SELECT DISTINCT d.subscription_id, coalesce(d.asset_id, '') AS asset_key
  FROM bridge.deliveries d WHERE d.status IN ('pending', 'delivering')) s
WHERE NOT EXISTS (SELECT 1 FROM bridge.delivery_parks p
                  WHERE p.subscription_id = s.subscription_id AND p.asset_key = s.asset_key)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Until the fast lane starts, the default path writes no park marker: not on
// the fan-out insert, not on a settle, not on a revive. Turning the fast lane
// on parks every stream that has an open row, and from then on every writer
// parks.
func TestDefaultPathWritesNoParkMarkerUntilTheFastLaneStarts(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSub(t, "https://example.com/hook")
	first := b.insert(t, sub.ID, "a", 1, `{}`)
	b.insert(t, sub.ID, "a", 2, `{}`)
	b.insert(t, sub.ID, "b", 1, `{}`)
	dead := b.insert(t, sub.ID, "c", 1, `{}`)
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.deliveries SET status = 'delivered', delivered_at = now() WHERE id = $1`, first); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.deliveries SET status = 'dead', dead_at = now() WHERE id = $1`, dead); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.deliveries SET status = 'pending', attempts = 0 WHERE id = $1`, dead); err != nil {
		t.Fatal(err)
	}
	if n := b.parks(t); n != 0 {
		t.Fatalf("%d park markers written on the default path, want 0", n)
	}

	n, err := b.store.EnableParks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 || b.parks(t) != 3 || b.openStreamsWithoutMarker(t) != 0 {
		t.Fatalf("turning the fast lane on parked %d streams (%d markers, %d open streams without one), want a, b and c",
			n, b.parks(t), b.openStreamsWithoutMarker(t))
	}
	if again, err := b.store.EnableParks(ctx); err != nil || again != 0 {
		t.Fatalf("second switch-on parked %d (err %v), want 0: it happens once", again, err)
	}
	b.insert(t, sub.ID, "d", 1, `{}`)
	if b.parks(t) != 4 {
		t.Fatalf("%d markers after an insert with the fast lane on, want 4", b.parks(t))
	}
}

// A writer that skipped its marker (gate off) and has not committed holds
// the switch-on back: the switch-on's park then sees its row. Without the
// wait the stream would have an open row and no marker, and the fast lane
// would send its next event before that row.
func TestTurningTheFastLaneOnWaitsForWritersThatSkippedTheirMarker(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSub(t, "https://example.com/hook")
	revived := b.insert(t, sub.ID, "revived", 1, `{}`)
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.deliveries SET status = 'dead', dead_at = now() WHERE id = $1`, revived); err != nil {
		t.Fatal(err)
	}

	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at)
VALUES ($1, 'evt-inserted-1', 'asset.updated', 'assets', 'inserted', 1, '{}', now())`, sub.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE bridge.deliveries SET status = 'pending', attempts = 0 WHERE id = $1`, revived); err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	go func() { _, err := b.store.EnableParks(ctx); done <- err }()
	// The switch-on waits for the writer's lock.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		if err := b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = 0 AND objid = 7411008 AND objsubid = 1)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the switch-on finished (err %v) while a writer that skipped its marker was still open", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the switch-on never waited for the open writer")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := b.openStreamsWithoutMarker(t); n != 0 || b.parks(t) != 2 {
		t.Fatalf("%d open streams without a marker, %d markers; want 0 and 2 (the inserted and the revived stream)", n, b.parks(t))
	}
}

// Writers keep inserting deliveries into new streams while the fast lane is
// turned on: afterwards no stream with an open row is without its marker.
func TestTurningTheFastLaneOnUnderConcurrentInsertsLeavesNoStreamUnparked(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSub(t, "https://example.com/hook")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Several statements per transaction, the consumer's batch.
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					for k := range 3 {
						asset := fmt.Sprintf("w%d-%d-%d", w, i, k)
						if _, err := tx.Exec(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at)
VALUES ($1, $2, 'asset.updated', 'assets', $3, 1, '{}', now())`, sub.ID, "evt-"+asset, asset); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Let the writers run before and after the switch-on.
	waitRows := func(n int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			var have int
			if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries`).Scan(&have); err != nil {
				t.Fatal(err)
			}
			if have >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("writers wrote %d rows, want %d", have, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitRows(200)
	if _, err := b.store.EnableParks(ctx); err != nil {
		t.Fatal(err)
	}
	var at int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries`).Scan(&at); err != nil {
		t.Fatal(err)
	}
	waitRows(at + 200)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := b.openStreamsWithoutMarker(t); n != 0 {
		t.Fatalf("%d streams with an open row and no marker after the switch-on", n)
	}
}
