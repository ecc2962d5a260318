package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/outbox"
)

func inTx(t *testing.T, db *pgtest.DB, fn func(tx pgx.Tx) error) error {
	t.Helper()
	return pgx.BeginFunc(context.Background(), db.Pool, fn)
}

func TestEnqueueRejectsBadInput(t *testing.T) {
	db := pgtest.NewParallel(t)
	cases := []struct {
		name string
		ev   outbox.Event
		want string
	}{
		{"empty topic", outbox.Event{EventType: "e", Payload: json.RawMessage(`{}`)}, "topic must not be empty"},
		{"empty event type", outbox.Event{Topic: "t", Payload: json.RawMessage(`{}`)}, "event type must not be empty"},
		{"invalid JSON", outbox.Event{Topic: "t", EventType: "e", Payload: json.RawMessage(`{"a":`)}, "payload is not valid JSON"},
		{"empty payload", outbox.Event{Topic: "t", EventType: "e"}, "payload must not be empty"},
	}
	for _, c := range badTopics {
		cases = append(cases, struct {
			name string
			ev   outbox.Event
			want string
		}{"topic " + c.topic[:min(len(c.topic), 20)], outbox.Event{Topic: c.topic, EventType: "e", Payload: json.RawMessage(`{}`)}, c.want})
	}
	for _, c := range cases {
		err := inTx(t, db, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(context.Background(), tx, c.ev)
			return err
		})
		if !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.want)
		}
	}
	var n int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM bridge.outbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows written by rejected events: %d (%v)", n, err)
	}
}

// The SQL function is the contract for every other language: it refuses the
// same inputs with errors that say what is wrong.
func TestSQLEnqueueRejectsBadInput(t *testing.T) {
	db := pgtest.NewParallel(t)
	cases := []struct {
		name, sql, want string
	}{
		{"null topic", `SELECT bridge.enqueue(NULL, 'a', 'e', '{}')`, "topic must not be empty"},
		{"empty topic", `SELECT bridge.enqueue('  ', 'a', 'e', '{}')`, "topic must not be empty"},
		{"null event type", `SELECT bridge.enqueue('t', 'a', NULL, '{}')`, "event_type must not be empty"},
		{"empty event type", `SELECT bridge.enqueue('t', 'a', '', '{}')`, "event_type must not be empty"},
		{"invalid JSON", `SELECT bridge.enqueue('t', 'a', 'e', '{"a":')`, "invalid input syntax for type json"},
		{"null payload", `SELECT bridge.enqueue('t', 'a', 'e', NULL)`, "payload must not be NULL"},
		{"headers not an object", `SELECT bridge.enqueue('t', 'a', 'e', '{}', '[1]')`, "headers must be a JSON object"},
		{"header not a string", `SELECT bridge.enqueue('t', 'a', 'e', '{}', '{"x": 1}')`, "every header value must be a JSON string"},
	}
	for _, c := range cases {
		_, err := db.Pool.Exec(context.Background(), c.sql)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.want)
		}
	}
	for _, c := range badTopics {
		_, err := db.Pool.Exec(context.Background(), `SELECT bridge.enqueue($1, 'a', 'e', '{}')`, c.topic)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "22023" || !strings.Contains(pe.Message, "is not a valid Kafka topic name: "+c.want) {
			t.Errorf("bridge.enqueue(topic %.40q) = %v, want 22023 naming %q", c.topic, err, c.want)
		}
	}
	for _, ok := range goodTopics {
		if _, err := db.Pool.Exec(context.Background(), `SELECT bridge.enqueue($1, 'a', 'e', '{}')`, ok); err != nil {
			t.Errorf("bridge.enqueue(topic %q): %v", ok, err)
		}
	}
}

// Topic names Kafka refuses, each with the rule the error must name; the
// Go and SQL checks give the same message.
var badTopics = []struct{ topic, want string }{
	{"ux.bad topic", "only ASCII letters, digits, '.', '_' and '-' are allowed"},
	{"ux/slash", "only ASCII letters, digits, '.', '_' and '-' are allowed"},
	{"café", "only ASCII letters, digits, '.', '_' and '-' are allowed"},
	{"tab\tbed", "only ASCII letters, digits, '.', '_' and '-' are allowed"},
	{strings.Repeat("x", 250), "it is 250 characters long; at most 249 are allowed"},
	{strings.Repeat("é", 300), "it is 300 characters long; at most 249 are allowed"},
	{".", "'.' and '..' are not allowed"},
	{"..", "'.' and '..' are not allowed"},
	{"__consumer_offsets", "names starting with '__' are reserved for Kafka's internal topics"},
	{"__x", "names starting with '__' are reserved for Kafka's internal topics"},
}

var goodTopics = []string{"assets", "a", "A.b_c-9", "...", "_single", strings.Repeat("x", 249), "x__y"}

// Every good topic is enqueued by the Go API too.
func TestEnqueueAcceptsKafkaTopicNames(t *testing.T) {
	db := pgtest.NewParallel(t)
	for _, topic := range goodTopics {
		err := inTx(t, db, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(context.Background(), tx, outbox.Event{Topic: topic, EventType: "e", Payload: json.RawMessage(`{}`)})
			return err
		})
		if err != nil {
			t.Errorf("topic %q: %v", topic, err)
		}
	}
}

// A malformed traceparent is dropped with a warning, never failing the
// business transaction.
func TestSQLEnqueueDropsMalformedTraceparent(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	var warnings []string
	connCfg, _ := pgx.ParseConfig(db.URL)
	connCfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { warnings = append(warnings, n.Message) }
	conn2, err := pgx.ConnectConfig(ctx, connCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close(ctx)
	for _, bad := range []string{"garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01", "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"} {
		var id uuid.UUID
		if err := conn2.QueryRow(ctx, `SELECT bridge.enqueue('t', 'a', 'e', '{}', '{}', $1)`, bad).Scan(&id); err != nil {
			t.Fatalf("traceparent %q failed the enqueue: %v", bad, err)
		}
		var tp *string
		if err := conn2.QueryRow(ctx, `SELECT traceparent FROM bridge.outbox WHERE id = $1`, id).Scan(&tp); err != nil {
			t.Fatal(err)
		}
		if tp != nil {
			t.Errorf("malformed traceparent %q stored as %q", bad, *tp)
		}
	}
	if len(warnings) != 4 || !strings.Contains(warnings[0], "dropping malformed traceparent") {
		t.Fatalf("warnings = %q", warnings)
	}
}

// Enqueue captures the caller's span context.
func TestEnqueueCapturesTraceContext(t *testing.T) {
	db := pgtest.NewParallel(t)
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, _ := trace.ParseTraceState("vendor=abc")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled, TraceState: ts})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	var id uuid.UUID
	err := inTx(t, db, func(tx pgx.Tx) error {
		var err error
		id, err = outbox.Enqueue(ctx, tx, outbox.Event{Topic: "t", AssetID: "a", EventType: "e", Payload: json.RawMessage(`{"x":1}`), Headers: map[string]string{"tenant": "t1"}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var tp, tstate, hdr string
	if err := db.Pool.QueryRow(context.Background(), `SELECT traceparent, tracestate, headers::text FROM bridge.outbox WHERE id = $1`, id).Scan(&tp, &tstate, &hdr); err != nil {
		t.Fatal(err)
	}
	if tp != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || tstate != "vendor=abc" {
		t.Fatalf("stored traceparent %q tracestate %q", tp, tstate)
	}
	if hdr != `{"tenant": "t1"}` {
		t.Fatalf("headers %s", hdr)
	}
}

// asset_seq is gapless per asset: a rolled-back transaction leaves no hole;
// "" is the null-asset stream.
func TestAssetSeqGaplessAcrossRollback(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	ev := func(asset string) outbox.Event {
		return outbox.Event{Topic: "t", AssetID: asset, EventType: "e", Payload: json.RawMessage(`1`)}
	}
	for i, commit := range []bool{true, false, true, false, false, true} {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.EnqueueBatch(ctx, tx, []outbox.Event{ev("A"), ev(""), ev("A")}); err != nil {
			t.Fatalf("tx %d: %v", i, err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	rows, err := db.Pool.Query(ctx, `SELECT coalesce(asset_id, '(null)'), array_agg(asset_seq ORDER BY seq) FROM bridge.outbox GROUP BY 1 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]int64{}
	for rows.Next() {
		var k string
		var s []int64
		if err := rows.Scan(&k, &s); err != nil {
			t.Fatal(err)
		}
		got[k] = s
	}
	if fmt.Sprint(got["A"]) != "[1 2 3 4 5 6]" || fmt.Sprint(got["(null)"]) != "[1 2 3]" {
		t.Fatalf("asset_seq per asset = %v", got)
	}
}

// Batches that touch the same assets in opposite orders do not deadlock:
// EnqueueBatch takes the per-asset locks in sorted order.
func TestEnqueueBatchOppositeOrdersDoNotDeadlock(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := t.Context()
	mk := func(assets ...string) []outbox.Event {
		var out []outbox.Event
		for _, a := range assets {
			out = append(out, outbox.Event{Topic: "t", AssetID: a, EventType: "e", Payload: json.RawMessage(`{}`)})
		}
		return out
	}
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				evs := mk("A", "B", "C")
				if i%2 == 1 {
					evs = mk("C", "B", "A")
				}
				errs <- pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					_, err := outbox.EnqueueBatch(ctx, tx, evs)
					return err
				})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("batch failed (deadlock?): %v", err)
		}
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.outbox`).Scan(&n); err != nil || n != 8*25*3 {
		t.Fatalf("rows = %d (%v)", n, err)
	}
}

// bridge.enqueue_batch (what EnqueueBatch calls) keeps bridge.enqueue's
// rules event by event: the same checks naming the event, a malformed
// traceparent dropped, and per asset asset_seq continuing the asset's
// numbering in array order, with seq in array order.
func TestSQLEnqueueBatchKeepsEnqueueRules(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := context.Background()
	batch := func(topics, assets, types, payloads, headers, tps, tss string) string {
		return fmt.Sprintf(`SELECT bridge.enqueue_batch(%s::text[], %s::text[], %s::text[], %s::text[]::jsonb[], %s::text[]::jsonb[], %s::text[], %s::text[])`,
			topics, assets, types, payloads, headers, tps, tss)
	}
	cases := []struct{ name, sql, want string }{
		{"bad topic", batch(`'{t,"bad topic"}'`, `'{a,a}'`, `'{e,e}'`, `'{1,2}'`, `'{"{}","{}"}'`, `'{NULL,NULL}'`, `'{NULL,NULL}'`),
			"event 2 (of 2): topic 'bad topic' is not a valid Kafka topic name: only ASCII letters"},
		{"empty event type", batch(`'{t}'`, `'{a}'`, `'{""}'`, `'{1}'`, `'{"{}"}'`, `'{NULL}'`, `'{NULL}'`), "event 1 (of 1): event_type must not be empty"},
		{"null payload", batch(`'{t}'`, `'{a}'`, `'{e}'`, `'{NULL}'`, `'{"{}"}'`, `'{NULL}'`, `'{NULL}'`), "payload must not be NULL"},
		{"headers not an object", batch(`'{t}'`, `'{a}'`, `'{e}'`, `'{1}'`, `'{"[1]"}'`, `'{NULL}'`, `'{NULL}'`), "headers must be a JSON object of strings, got array"},
		{"header not a string", batch(`'{t}'`, `'{a}'`, `'{e}'`, `'{1}'`, `'{"{\"x\": 1}"}'`, `'{NULL}'`, `'{NULL}'`), "every header value must be a JSON string"},
		{"arrays of different lengths", batch(`'{t}'`, `'{a,b}'`, `'{e}'`, `'{1}'`, `'{"{}"}'`, `'{NULL}'`, `'{NULL}'`), "every array must hold one element per event"},
	}
	for _, c := range cases {
		_, err := db.Pool.Exec(ctx, c.sql)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "22023" || !strings.Contains(pe.Message, c.want) {
			t.Errorf("%s: err = %v, want 22023 %q", c.name, err, c.want)
		}
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.outbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows written by refused batches (%v)", n, err)
	}

	good := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if _, err := db.Pool.Exec(ctx, `SELECT bridge.enqueue('t', 'A', 'e', '{}')`); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, batch(`'{t,t,t,t}'`, `'{B,A,NULL,A}'`, `'{e,e,e,e}'`, `'{1,2,3,4}'`, `'{"{}",NULL,"{\"k\": \"v\"}","{}"}'`,
		`'{`+good+`,bad,NULL,NULL}'`, `'{s1,s2,NULL,NULL}'`))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil || len(ids) != 4 {
		t.Fatalf("ids %v, err %v", ids, err)
	}
	type got struct {
		ID       uuid.UUID
		Asset    string
		AssetSeq int64
		Payload  string
		TP, TS   string
	}
	rs, err := db.Pool.Query(ctx, `SELECT id, coalesce(asset_id, ''), asset_seq, payload::text, coalesce(traceparent, ''), coalesce(tracestate, '')
		FROM bridge.outbox WHERE payload::text <> '{}' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	all, err := pgx.CollectRows(rs, pgx.RowToStructByPos[got])
	if err != nil {
		t.Fatal(err)
	}
	want := []got{{ids[0], "B", 1, "1", good, "s1"}, {ids[1], "A", 2, "2", "", ""}, {ids[2], "", 1, "3", "", ""}, {ids[3], "A", 3, "4", "", ""}}
	if fmt.Sprint(all) != fmt.Sprint(want) {
		t.Fatalf("rows in seq order:\n got %v\nwant %v", all, want)
	}
}
