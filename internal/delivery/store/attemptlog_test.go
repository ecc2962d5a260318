package store

import (
	"errors"
	"testing"
	"time"
)

// logAttempts writes n fast-lane attempts of (sub, event) through the fast
// lane's own insert, one second apart from start, and returns them as the
// log shows them.
func (b *testBundle) logFastAttempts(t testing.TB, sub, event string, start time.Time, n int) []Attempt {
	t.Helper()
	ctx := t.Context()
	if err := b.store.EnsureAttemptPartitions(ctx, start, 2); err != nil {
		t.Fatal(err)
	}
	as := make([]FastAttempt, n)
	want := make([]Attempt, n)
	asset := "a"
	for i := range n {
		at := start.Add(time.Duration(i) * time.Second)
		code := 500
		as[i] = FastAttempt{SubscriptionID: sub, EventID: event, EventType: "asset.updated", Topic: "assets",
			Partition: 2, Offset: int64(100 + i), AssetID: &asset, Attempt: i + 1,
			Outcome: Outcome{StartedAt: at, Duration: 3 * time.Millisecond, StatusCode: code, Error: "HTTP 500", ResponseBody: "no", TraceID: "t"}}
		want[i] = Attempt{Lane: LaneFast, Attempt: i + 1, StartedAt: at, DurationMS: 3, StatusCode: &code, Error: "HTTP 500", ResponseBody: "no", TraceID: "t"}
	}
	if err := b.store.LogFastAttempts(ctx, as, nil); err != nil {
		t.Fatal(err)
	}
	return want
}

func sameAttempt(a, b Attempt) bool {
	return a.Lane == b.Lane && a.Attempt == b.Attempt && a.StartedAt.Equal(b.StartedAt) && a.DurationMS == b.DurationMS &&
		(a.StatusCode == nil) == (b.StatusCode == nil) && (a.StatusCode == nil || *a.StatusCode == *b.StatusCode) &&
		a.Error == b.Error && a.ResponseBody == b.ResponseBody && a.TraceID == b.TraceID
}

// A delivery the fast lane made alone is read by (subscription, event id),
// oldest first, and paging neither repeats nor skips an attempt; another
// event's attempts never show.
func TestAttemptLogReadsFastLaneAttemptsPaged(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSub(t, "https://example.com/hook")
	start := time.Now().UTC().Truncate(time.Microsecond)
	want := b.logFastAttempts(t, sub.ID, "evt-fast", start, 5)
	b.logFastAttempts(t, sub.ID, "evt-other", start, 2)

	var got []Attempt
	p := AttemptLogParams{SubscriptionID: sub.ID, EventID: "evt-fast", Limit: 2}
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		page, err := b.store.AttemptLog(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, page.Attempts...)
		if page.NextCursor == "" {
			break
		}
		p.After = page.NextCursor
	}
	if len(got) != len(want) {
		t.Fatalf("got %d attempts, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if !sameAttempt(got[i], want[i]) {
			t.Fatalf("attempt %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

// A delivery the fast lane tried and then parked: by its delivery id (and
// by its key) the log holds the fast lane's attempt and the slow lane's, in
// time order.
func TestAttemptLogMergesBothLanesOfAParkedDelivery(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSub(t, "https://example.com/hook")
	id := b.insert(t, sub.ID, "a", 1, `{"secret":"payload"}`)
	var event string
	if err := b.pool.QueryRow(ctx, `SELECT event_id FROM bridge.deliveries WHERE id = $1`, id).Scan(&event); err != nil {
		t.Fatal(err)
	}
	start := time.Now().UTC().Add(-time.Minute).Truncate(time.Microsecond)
	fast := b.logFastAttempts(t, sub.ID, event, start, 1)
	slowAt := start.Add(30 * time.Second)
	if _, err := b.pool.Exec(ctx, `
INSERT INTO bridge.delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code, error)
VALUES ($1, 2, $2, 7, NULL, 'connection refused'), ($1, 3, $3, 4, 204, NULL)`, id, slowAt, slowAt.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	ok := 204
	want := []Attempt{fast[0],
		{Lane: LaneSlow, Attempt: 2, StartedAt: slowAt, DurationMS: 7, Error: "connection refused"},
		{Lane: LaneSlow, Attempt: 3, StartedAt: slowAt.Add(time.Second), DurationMS: 4, StatusCode: &ok}}
	byID, err := b.store.AttemptLog(ctx, AttemptLogParams{DeliveryID: id, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	got := byID.Attempts
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if !sameAttempt(got[i], want[i]) {
			t.Fatalf("attempt %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	page, err := b.store.AttemptLog(ctx, AttemptLogParams{SubscriptionID: sub.ID, EventID: event, Limit: 1, After: ""})
	if err != nil || len(page.Attempts) != 1 || !sameAttempt(page.Attempts[0], fast[0]) || page.NextCursor == "" {
		t.Fatalf("first page by key: %+v, %v", page, err)
	}
	page, err = b.store.AttemptLog(ctx, AttemptLogParams{SubscriptionID: sub.ID, EventID: event, Limit: 5, After: page.NextCursor})
	if err != nil || len(page.Attempts) != 2 || page.Attempts[0].Lane != LaneSlow || page.NextCursor != "" {
		t.Fatalf("second page by key: %+v, %v", page, err)
	}
}

func TestAttemptLogRefusesBadSelectors(t *testing.T) {
	b, ctx := setup(t)
	if _, err := b.store.AttemptLog(ctx, AttemptLogParams{DeliveryID: 987654321, Limit: 1}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown delivery: %v, want ErrNotFound", err)
	}
	for _, p := range []AttemptLogParams{
		{SubscriptionID: "x", EventID: "e", Limit: 1},
		{SubscriptionID: "00000000-0000-0000-0000-000000000001", Limit: 1},
		{DeliveryID: 1, EventID: "e", Limit: 1},
		{DeliveryID: 1, Limit: 0},
		{SubscriptionID: "00000000-0000-0000-0000-000000000001", EventID: "e", Limit: 1, After: "1.2"},
	} {
		var ve *ValidationError
		if _, err := b.store.AttemptLog(ctx, p); !errors.As(err, &ve) {
			t.Fatalf("%+v: %v, want a ValidationError", p, err)
		}
	}
}
