package outboxstore

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxbridge/bridge/internal/pgtest"
)

// TestFailedFilters: every FailedFilter field narrows the list, the count
// and the replay alike (one WHERE clause), and GetRow reads any status with
// headers and the payload only when asked.
func TestFailedFilters(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	enqueue := func(topic, asset, typ string) uuid.UUID {
		var id uuid.UUID
		err := db.Pool.QueryRow(ctx, `SELECT bridge.enqueue($1, $2, $3, '{"x":1}', '{"h":"v"}',
			'00-0123456789abcdef0123456789abcdef-0123456789abcdef-01')`, topic, asset, typ).Scan(&id)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	a := enqueue("t1", "a1", "e.one")
	b := enqueue("t1", "a2", "e.two")
	c := enqueue("t2", "a1", "e.one")
	_ = enqueue("t2", "a3", "e.one") // stays NEW
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.outbox SET status = 'FAILED', failed_at = now() - interval '1 hour',
		last_error = CASE WHEN id = $1 THEN 'Broker said 100% NO' ELSE 'too large' END WHERE id = ANY($2)`, a, []uuid.UUID{a, b, c}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		f    FailedFilter
		want []uuid.UUID
	}{
		{"all", FailedFilter{}, []uuid.UUID{a, b, c}},
		{"topic", FailedFilter{Topic: "t1"}, []uuid.UUID{a, b}},
		{"asset", FailedFilter{AssetID: "a1"}, []uuid.UUID{a, c}},
		{"event type", FailedFilter{EventType: "e.two"}, []uuid.UUID{b}},
		{"error text, case and % literal", FailedFilter{ErrorContains: "100% no"}, []uuid.UUID{a}},
		{"failed before", FailedFilter{FailedTo: time.Now().Add(-30 * time.Minute)}, []uuid.UUID{a, b, c}},
		{"failed after", FailedFilter{FailedFrom: time.Now().Add(-30 * time.Minute)}, nil},
	}
	for _, tc := range cases {
		rows, err := ListFailedMatching(ctx, db.Pool, tc.f, 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got []uuid.UUID
		for _, r := range rows {
			got = append(got, r.ID)
		}
		if len(got) != len(tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
			}
		}
		n, err := CountFailedMatching(ctx, db.Pool, tc.f)
		if err != nil || n != int64(len(tc.want)) {
			t.Errorf("%s: count = %d, %v; want %d", tc.name, n, err, len(tc.want))
		}
	}
	page, err := ListFailedMatching(ctx, db.Pool, FailedFilter{}, 2, 0)
	if err != nil || len(page) != 2 {
		t.Fatalf("first page: %v %v", page, err)
	}
	rest, err := ListFailedMatching(ctx, db.Pool, FailedFilter{}, 2, page[1].Seq)
	if err != nil || len(rest) != 1 || rest[0].ID != c {
		t.Fatalf("second page: %v %v", rest, err)
	}

	n, err := ReplayFailedMatching(ctx, db.Pool, FailedFilter{Topic: "t1", AssetID: "a2"})
	if err != nil || n != 1 {
		t.Fatalf("replay matching = %d, %v; want 1", n, err)
	}
	row, err := GetRow(ctx, db.Pool, b, false)
	if err != nil {
		t.Fatal(err)
	}
	if row.Status != "NEW" || row.ReplayedAt == nil || row.Payload != nil || row.Headers["h"] != "v" ||
		row.TraceID() != "0123456789abcdef0123456789abcdef" {
		t.Fatalf("replayed row = %+v", row)
	}
	row, err = GetRow(ctx, db.Pool, b, true)
	if err != nil || row.Payload == nil || *row.Payload != `{"x": 1}` {
		t.Fatalf("row with payload = %+v, %v", row, err)
	}

	ts, err := ReadTopicStats(ctx, db.Pool)
	if err != nil || len(ts) != 2 {
		t.Fatalf("topic stats = %+v, %v", ts, err)
	}
	if ts[0].Topic != "t1" || ts[0].New != 1 || ts[0].Failed != 1 || ts[1].New != 1 || ts[1].Failed != 1 || ts[1].OldestNewAgeSeconds < 0 {
		t.Fatalf("topic stats = %+v", ts)
	}
	// The lanes pass the log's NEW row (the held ones — FAILED, and the
	// replayed one waiting for a relay — stay): the log records no send
	// time, so the latencies are 0.
	passAll(t, ctx, db)
	tp, err := ReadThroughput(ctx, db.Pool, time.Minute)
	if err != nil || tp.Sent != 1 || tp.LatencyP50 != 0 || tp.LatencyP95 != 0 {
		t.Fatalf("throughput = %+v, %v", tp, err)
	}
}
