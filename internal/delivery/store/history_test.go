package store

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/outbox"
)

// TestCopyHistoryInAssetOrderResumableAndHeldFromClaims: the copy takes,
// in bounded batches and (asset, asset_seq) order, exactly the retained
// outbox rows that match the subscription — not those before since, not a
// FAILED one, not another event type, not a topic the consumer does not
// read — moves a delivery the live fan-out already wrote into its place
// in the history, numbers the history
// below the live ones, and resumes from its committed cursor in a new store
// (a restarted deliverer). Until it is done the subscription is not
// claimed; then each stream's history goes first.
func TestCopyHistoryInAssetOrderResumableAndHeldFromClaims(t *testing.T) {
	b, ctx := setup(t)
	enqueue := func(topic, asset, typ string) string {
		var id uuid.UUID
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			id, err = outbox.Enqueue(ctx, tx, outbox.Event{Topic: topic, AssetID: asset, EventType: typ, Payload: json.RawMessage(`{}`)})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return id.String()
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := b.pool.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	old := enqueue("assets", "x", "asset.updated") // before since
	exec(`UPDATE bridge.outbox SET created_at = now() - interval '2 hours' WHERE id = $1`, old)
	x2 := enqueue("assets", "x", "asset.updated")
	y1 := enqueue("assets", "y", "asset.updated")
	failed := enqueue("assets", "y", "asset.updated")
	exec(`UPDATE bridge.outbox SET status = 'FAILED', failed_at = now() WHERE id = $1`, failed)
	y3 := enqueue("assets", "y", "asset.updated")
	enqueue("assets", "y", "other.thing")   // another event type
	enqueue("unread", "z", "asset.updated") // a topic the consumer does not read
	x3 := enqueue("assets", "x", "asset.updated")
	exec(`INSERT INTO bridge.consumer_inbox (dedup_id, topic, kafka_partition, kafka_offset) VALUES ('r1', 'assets', 0, 0)`)

	since := time.Now().Add(-time.Hour)
	url := "https://a.example/hook"
	s, err := b.subs.Create(ctx, SubscriptionInput{URL: &url, EventTypes: []string{"asset.*"}, Since: &since})
	if err != nil {
		t.Fatal(err)
	}
	// The consumer routed x3 live meanwhile.
	exec(`INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at)
	      VALUES ($1, $2, 'asset.updated', 'assets', 'x', 3, '{}', now())`, s.ID, x3)

	claim := func() []Claim {
		cs, err := b.store.Claim(ctx, ClaimParams{ClaimedBy: "w", Limit: 10, MaxInFlight: 8, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	// One batch of 2 rows looked at, then a crash: a new store resumes.
	bt, ok, err := b.store.CopyHistory(ctx, 2)
	if err != nil || !ok || bt.Done || bt.Scanned != 2 {
		t.Fatalf("first batch %+v ok=%v err=%v", bt, ok, err)
	}
	// Written after the first batch fixed the bound: live only.
	live := enqueue("assets", "x", "asset.updated")
	exec(`INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at)
	      VALUES ($1, $2, 'asset.updated', 'assets', 'x', 4, '{}', now())`, s.ID, live)
	if cs := claim(); len(cs) != 0 {
		t.Fatalf("claimed %d deliveries of a subscription whose history is still being copied", len(cs))
	}
	restarted := NewDeliveryStore(b.pool)
	for {
		bt, ok, err = restarted.CopyHistory(ctx, 2)
		if err != nil || !ok {
			t.Fatalf("batch %+v ok=%v err=%v", bt, ok, err)
		}
		if bt.Done {
			break
		}
	}
	if _, ok, _ := restarted.CopyHistory(ctx, 2); ok {
		t.Fatal("a finished history was picked again")
	}

	rows, err := b.pool.Query(ctx, `SELECT event_id, seq < 0 FROM bridge.deliveries WHERE subscription_id = $1 ORDER BY coalesce(asset_id, ''), seq`, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	type d struct {
		id      string
		history bool
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (d, error) {
		var v d
		return v, r.Scan(&v.id, &v.history)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []d{{x2, true}, {x3, true}, {live, false}, {y1, true}, {y3, true}}
	if len(got) != len(want) {
		t.Fatalf("deliveries %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("deliveries %v, want %v", got, want)
		}
	}
	h := b.sub(t, s.ID).History
	if h == nil || h.DoneAt == nil || h.Copied != 4 || !h.Since.Equal(since.Truncate(time.Microsecond)) {
		t.Errorf("history %+v", h)
	}
	// Now claimable, history first: x2 and y1 are the heads.
	heads := map[string]bool{}
	for _, c := range claim() {
		heads[c.EventID] = true
	}
	if len(heads) != 2 || !heads[x2] || !heads[y1] {
		t.Errorf("first claims %v, want the history heads x2 and y1", heads)
	}
}

// TestSinceIsCheckedWhereItEnters: unparseable, negative or future since is
// refused naming the field; since on update is refused; nothing is written.
func TestSinceIsCheckedWhereItEnters(t *testing.T) {
	b, ctx := setup(t)
	now := time.Now()
	for _, v := range []string{"", "yesterday", "-2h", now.Add(time.Hour).Format(time.RFC3339)} {
		if _, err := ParseSince(v, now); !isField(err, "since") {
			t.Errorf("ParseSince(%q) = %v, want an error naming since", v, err)
		}
	}
	if ts, err := ParseSince("90m", now); err != nil || !ts.Equal(now.Add(-90*time.Minute)) {
		t.Errorf("ParseSince(90m) = %v, %v", ts, err)
	}
	url := "https://a.example/hook"
	future := now.Add(time.Hour)
	if _, err := b.subs.Create(ctx, SubscriptionInput{URL: &url, EventTypes: []string{"*"}, Since: &future}); !isField(err, "since") {
		t.Errorf("create with a future since: %v", err)
	}
	if subs, _ := b.subs.List(ctx); len(subs) != 0 {
		t.Errorf("%d subscriptions written by a refused create", len(subs))
	}
	s := b.createSub(t, url)
	past := now.Add(-time.Hour)
	if _, err := b.subs.Update(ctx, s.ID, SubscriptionInput{Since: &past}); !isField(err, "since") {
		t.Errorf("update with since: %v", err)
	}
}

func isField(err error, field string) bool {
	ve, ok := err.(*ValidationError)
	return ok && ve.Field == field
}

// TestOneCopierTakesAHistoryAtATime: two copiers (two replicas' deliverers)
// never take the same subscription's history at once — the second gets the
// next subscription, a third none — and a history released unfinished (its
// copier stopped) is taken again. Progress written by the copy in progress
// shows in the subscription.
func TestOneCopierTakesAHistoryAtATime(t *testing.T) {
	b, ctx := setup(t)
	since := time.Now().Add(-time.Hour)
	var ids []string
	for _, u := range []string{"https://a.example/hook", "https://b.example/hook"} {
		s, err := b.subs.Create(ctx, SubscriptionInput{URL: &u, EventTypes: []string{"*"}, Since: &since})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	first, releaseFirst, ok, err := TakeHistory(ctx, b.pool)
	if err != nil || !ok || first.SubscriptionID != ids[0] {
		t.Fatalf("first take = %q, %v, %v; want the oldest, %s", first.SubscriptionID, ok, err, ids[0])
	}
	second, releaseSecond, ok, err := TakeHistory(ctx, b.pool)
	if err != nil || !ok || second.SubscriptionID != ids[1] {
		t.Fatalf("second take while the first is held = %q, %v, %v; want the next one, %s", second.SubscriptionID, ok, err, ids[1])
	}
	if third, _, ok, err := TakeHistory(ctx, b.pool); err != nil || ok {
		t.Fatalf("third take while both are held = %q, %v, %v; want none", third.SubscriptionID, ok, err)
	}
	if err := NoteHistoryProgress(ctx, b.pool, first.SubscriptionID, 42); err != nil {
		t.Fatal(err)
	}
	if s, err := b.subs.Get(ctx, first.SubscriptionID); err != nil || s.History == nil || s.History.Copied != 42 || s.History.DoneAt != nil {
		t.Fatalf("subscription after progress: %+v, %v; want 42 copied, not done", s, err)
	}
	releaseFirst()
	again, releaseAgain, ok, err := TakeHistory(ctx, b.pool)
	if err != nil || !ok || again.SubscriptionID != ids[0] {
		t.Fatalf("take after the first was released = %q, %v, %v; want %s again", again.SubscriptionID, ok, err, ids[0])
	}
	releaseAgain()
	releaseSecond()
}
