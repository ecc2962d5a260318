package store

import (
	"context"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/testkit"
)

func (b *testBundle) parks(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM bridge.delivery_parks`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func parked(sub, asset string, n int64) Parked {
	return Parked{SubscriptionID: sub, Event: Event{ID: "evt-" + asset + "-" + time.Now().Format("150405.000000000"),
		Type: "asset.updated", Topic: "assets", AssetID: &asset, AssetSeq: &n, Payload: `{}`, CreatedAt: time.Now()}}
}

// The hand-over's two sides on one stream: a settle of the stream's last row
// while an appender holds the marker leaves the marker (the appender's row
// keeps the stream parked); a settle with no appender deletes it, and the
// next append finds no marker, writes nothing and hands the stream back.
func TestParkMarkerHandOverNeverLosesARowBehindIt(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSub(t, "https://example.com/hook")
	if _, err := b.store.EnableParks(ctx); err != nil { // the fast lane's start
		t.Fatal(err)
	}
	key := Stream{SubscriptionID: sub.ID, AssetKey: "x"}
	marker := Marker{Stream: key, Topic: "assets", Partition: 3, Offset: 41}
	if _, err := b.store.HandOver(ctx, []Marker{marker}, nil, []Parked{parked(sub.ID, "x", 1)}); err != nil {
		t.Fatal(err)
	}
	if n := b.parks(t); n != 1 {
		t.Fatalf("%d markers after a park, want 1", n)
	}
	var first int64
	if err := b.pool.QueryRow(ctx, `SELECT id FROM bridge.deliveries WHERE asset_id = 'x'`).Scan(&first); err != nil {
		t.Fatal(err)
	}

	// An appender holds the marker; the slow lane settles the last row
	// meanwhile: it must neither wait nor delete the marker.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `SELECT 1 FROM bridge.delivery_parks WHERE subscription_id = $1 AND asset_key = 'x' FOR UPDATE`, sub.ID); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := b.pool.Exec(sctx, `UPDATE bridge.deliveries SET status = 'delivered', delivered_at = now() WHERE id = $1`, first); err != nil {
		t.Fatalf("settle while an appender holds the marker: %v", err)
	}
	if _, err := tx.Exec(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at)
VALUES ($1, 'evt-x-2', 'asset.updated', 'assets', 'x', 2, '{}', now())`, sub.ID); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.parks(t); n != 1 {
		t.Fatalf("%d markers after a settle raced an append, want 1 (a row is open behind it)", n)
	}

	// The stream's last row settles with nobody appending: the stream is
	// back in the fast lane.
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.deliveries SET status = 'delivered', delivered_at = now() WHERE event_id = 'evt-x-2'`); err != nil {
		t.Fatal(err)
	}
	if n := b.parks(t); n != 0 {
		t.Fatalf("%d markers after the last row settled, want 0", n)
	}
	back, err := b.store.HandOver(ctx, nil, []Stream{key}, []Parked{parked(sub.ID, "x", 3)})
	if err != nil {
		t.Fatal(err)
	}
	if len(back) != 1 || back[0] != key {
		t.Fatalf("append after the marker was cleared returned %v, want the stream back", back)
	}
	var open int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries WHERE status IN ('pending', 'delivering')`).Scan(&open); err != nil {
		t.Fatal(err)
	}
	if open != 0 {
		t.Fatalf("%d rows written for a stream that was no longer parked", open)
	}

	// A revive reopens a dead row: the stream is parked again.
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.deliveries SET status = 'dead', dead_at = now() WHERE id = $1`, first); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.deliveries SET status = 'pending', attempts = 0 WHERE id = $1`, first); err != nil {
		t.Fatal(err)
	}
	if n := b.parks(t); n != 1 {
		t.Fatalf("%d markers after a revive, want 1", n)
	}
}

// A marker left without rows (its appender rolled back after the last settle
// skipped it) is swept; one with an open row is not.
func TestSweepParksDeletesOnlyEmptyMarkers(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSub(t, "https://example.com/hook")
	if _, err := b.store.EnableParks(ctx); err != nil { // the fast lane's start
		t.Fatal(err)
	}
	b.insert(t, sub.ID, "kept", 1, `{}`)
	if _, err := b.pool.Exec(ctx, `INSERT INTO bridge.delivery_parks (subscription_id, asset_key, topic) VALUES ($1, 'empty', 'assets')`, sub.ID); err != nil {
		t.Fatal(err)
	}
	n, err := b.store.SweepParks(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || b.parks(t) != 1 {
		t.Fatalf("swept %d, %d left; want 1 swept and the open stream's marker kept", n, b.parks(t))
	}
}

// The attempt log's partitions: created ahead, dropped whole past retention.
func TestAttemptLogPartitionsAreCreatedAndDropped(t *testing.T) {
	b, ctx := setup(t)
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	if err := b.store.EnsureAttemptPartitions(ctx, now, 2); err != nil {
		t.Fatal(err)
	}
	if err := b.store.LogFastAttempts(ctx, []FastAttempt{{SubscriptionID: "00000000-0000-0000-0000-000000000001",
		EventID: "e", EventType: "t", Topic: "assets", Attempt: 1, Outcome: Outcome{StartedAt: now, StatusCode: 204}}}, nil); err != nil {
		t.Fatal(err)
	}
	dropped, err := b.store.DropAttemptPartitions(ctx, now.AddDate(0, 0, -1).Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 0 {
		t.Fatalf("dropped %v before any day had passed retention", dropped)
	}
	dropped, err = b.store.DropAttemptPartitions(ctx, now.AddDate(0, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 2 || dropped[0] == dropped[1] {
		t.Fatalf("dropped %v, want the partitions of the 9th and the 10th", dropped)
	}
	var rows int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM bridge.webhook_attempts`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Fatalf("%d attempt rows left after their day was dropped", rows)
	}
}

// Partition upkeep has no leader: every member runs it, advisory lock
// 7411006 only serialises their DDL for one transaction. A member killed
// while it holds the lock (its backend terminated mid-upkeep, as a SIGKILL
// of the process ends its session) releases it, and the upkeep another
// member was waiting to run goes on and creates the partitions.
func TestPartitionUpkeepGoesOnWhenTheMemberHoldingItsLockDies(t *testing.T) {
	b, ctx := setup(t)
	holder, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // its session is terminated below
	var holderPID int
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holderPID); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, attemptPartitionsLock); err != nil {
		t.Fatal(err)
	}
	day := time.Date(2031, 5, 20, 12, 0, 0, 0, time.UTC)
	done := make(chan error, 1)
	go func() { done <- b.store.EnsureAttemptPartitions(ctx, day, 1) }()
	// The other member's upkeep waits on the lock.
	testkit.Eventually(t, 10*time.Second, func() string {
		var waiting int
		_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 7411006 AND NOT granted`).Scan(&waiting)
		return testkit.Unless(waiting == 1, "no upkeep waiting on advisory lock 7411006")
	})
	select {
	case err := <-done:
		t.Fatalf("upkeep ran while another member held the lock (err %v)", err)
	default:
	}
	var killed bool
	if err := b.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, holderPID).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminate the lock holder's session: %v %v", killed, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("upkeep after the holder died: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("upkeep still waiting 30 s after the lock holder died")
	}
	var parts int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'bridge.webhook_attempts'::regclass
		AND c.relname IN ('webhook_attempts_20310519', 'webhook_attempts_20310520', 'webhook_attempts_20310521')`).Scan(&parts); err != nil {
		t.Fatal(err)
	}
	if parts != 3 {
		t.Fatalf("%d of the 3 day partitions around %s exist after the surviving member's upkeep", parts, day.Format(time.DateOnly))
	}
}

// A delivery appended behind a head that waits for its retry is not due
// before that head, so it does not make the stream ready early (each such
// wake-up was a claim that found the head not due); behind a head in flight
// it is due at once, and the order is the stream's either way.
func TestHandOverBehindAWaitingHeadLeavesTheStreamAsleep(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSub(t, "https://example.com/hook")
	key := Stream{SubscriptionID: sub.ID, AssetKey: "x"}
	head := parked(sub.ID, "x", 1)
	head.Attempts, head.RetryIn, head.StatusCode, head.Error = 1, time.Hour, 500, "HTTP 500"
	behind := parked(sub.ID, "x", 2)
	behind.RetryIn = time.Hour // the fast lane's rows behind a failed head in the same hand-over
	if _, err := b.store.HandOver(ctx, []Marker{{Stream: key, Topic: "assets", Partition: 1, Offset: 7}}, nil, []Parked{head, behind}); err != nil {
		t.Fatal(err)
	}
	readyIn := func() time.Duration {
		t.Helper()
		var secs float64
		if err := b.pool.QueryRow(ctx, `SELECT extract(epoch FROM ready_at - now()) FROM bridge.delivery_streams
			WHERE subscription_id = $1 AND asset_key = 'x'`, sub.ID).Scan(&secs); err != nil {
			t.Fatal(err)
		}
		return time.Duration(secs * float64(time.Second))
	}
	dueIn := func(seq int64) time.Duration {
		t.Helper()
		var secs float64
		if err := b.pool.QueryRow(ctx, `SELECT extract(epoch FROM next_attempt_at - now()) FROM bridge.deliveries
			WHERE subscription_id = $1 AND asset_seq = $2`, sub.ID, seq).Scan(&secs); err != nil {
			t.Fatal(err)
		}
		return time.Duration(secs * float64(time.Second))
	}
	if d := readyIn(); d < 50*time.Minute {
		t.Fatalf("stream ready in %v after a park whose head retries in 1h", d)
	}

	// Appended later, behind the waiting head.
	if back, err := b.store.HandOver(ctx, nil, []Stream{key}, []Parked{parked(sub.ID, "x", 3)}); err != nil || len(back) != 0 {
		t.Fatalf("append: back %v, err %v", back, err)
	}
	if d := readyIn(); d < 50*time.Minute {
		t.Fatalf("stream ready in %v after an append behind a head that retries in 1h: the append woke it", d)
	}
	if d := dueIn(3); d < 50*time.Minute || d > time.Hour+time.Minute {
		t.Fatalf("appended row due in %v, want the head's time (1h)", d)
	}

	// The head in flight: what is appended now is due at once.
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.deliveries SET status = 'delivering', lease_expires_at = now() + interval '1 hour',
		claimed_by = 'test' WHERE subscription_id = $1 AND asset_seq = 1`, sub.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.HandOver(ctx, nil, []Stream{key}, []Parked{parked(sub.ID, "x", 4)}); err != nil {
		t.Fatal(err)
	}
	if d := dueIn(4); d > time.Second {
		t.Fatalf("row appended behind a head in flight due in %v, want now", d)
	}

	// Order is the stream's: seq follows the hand-overs.
	rows, err := b.pool.Query(ctx, `SELECT asset_seq FROM bridge.deliveries WHERE subscription_id = $1 ORDER BY seq`, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for rows.Next() {
		var s int64
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	if rows.Err() != nil || len(seqs) != 4 || seqs[0] != 1 || seqs[1] != 2 || seqs[2] != 3 || seqs[3] != 4 {
		t.Fatalf("rows in seq order %v (err %v), want 1 2 3 4", seqs, rows.Err())
	}
}
