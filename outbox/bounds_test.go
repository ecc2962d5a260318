package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxbridge/bridge/internal/eventbounds"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/outbox"
)

// boundCase is one field at or past its bound: the Go API, bridge.enqueue
// and bridge.enqueue_batch accept the value at the bound and refuse the one
// past it, naming the argument and the limit.
type boundCase struct {
	name    string
	ev      outbox.Event
	wantErr string // "" = accepted
}

func boundCases() []boundCase {
	ev := func(mut func(*outbox.Event)) outbox.Event {
		e := outbox.Event{Topic: "t", AssetID: "a", EventType: "e", Payload: json.RawMessage(`{}`)}
		mut(&e)
		return e
	}
	manyHeaders := func(n int) map[string]string {
		h := make(map[string]string, n)
		for i := range n {
			h[fmt.Sprintf("h%03d", i)] = "v"
		}
		return h
	}
	// 2,680 characters of base64, the asset id that jammed the consumer.
	jam := strings.Repeat("QUJD", 670)
	return []boundCase{
		{"asset id at the bound", ev(func(e *outbox.Event) { e.AssetID = strings.Repeat("a", eventbounds.MaxAssetID) }), ""},
		{"asset id of 2680", ev(func(e *outbox.Event) { e.AssetID = jam }), "asset_id is 2680 bytes long; at most 512 are allowed"},
		{"asset id one past", ev(func(e *outbox.Event) { e.AssetID = strings.Repeat("a", eventbounds.MaxAssetID+1) }), "asset_id is 513 bytes long; at most 512 are allowed"},
		{"asset id multibyte past", ev(func(e *outbox.Event) { e.AssetID = strings.Repeat("é", 300) }), "asset_id is 600 bytes long; at most 512 are allowed"},
		{"event type at the bound", ev(func(e *outbox.Event) { e.EventType = strings.Repeat("e", eventbounds.MaxEventType) }), ""},
		{"event type one past", ev(func(e *outbox.Event) { e.EventType = strings.Repeat("e", eventbounds.MaxEventType+1) }), "event_type is 257 bytes long; at most 256 are allowed"},
		{"header name at the bound", ev(func(e *outbox.Event) { e.Headers = map[string]string{strings.Repeat("n", 256): "v"} }), ""},
		{"header name one past", ev(func(e *outbox.Event) { e.Headers = map[string]string{strings.Repeat("n", 257): "v"} }), "headers has a name 257 bytes long; at most 256 are allowed"},
		{"header value at the bound", ev(func(e *outbox.Event) { e.Headers = map[string]string{"x": strings.Repeat("v", 8192)} }), ""},
		{"header value one past", ev(func(e *outbox.Event) { e.Headers = map[string]string{"x": strings.Repeat("v", 8193)} }), "headers value of 'x' is 8193 bytes long; at most 8192 are allowed"},
		{"headers at the count", ev(func(e *outbox.Event) { e.Headers = manyHeaders(64) }), ""},
		{"headers one past the count", ev(func(e *outbox.Event) { e.Headers = manyHeaders(65) }), "headers has 65 entries; at most 64 are allowed"},
	}
}

func TestEnqueueRefusesValuesPastTheirBounds(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := context.Background()
	for _, c := range boundCases() {
		t.Run(c.name, func(t *testing.T) {
			payloadJSON := string(c.ev.Payload)
			headers := "{}"
			if c.ev.Headers != nil {
				b, _ := json.Marshal(c.ev.Headers)
				headers = string(b)
			}
			// The Go API (one event, and a batch with the event second).
			err := inTx(t, db, func(tx pgx.Tx) error { _, err := outbox.Enqueue(ctx, tx, c.ev); return err })
			checkGo(t, "Enqueue", err, c.wantErr)
			err = inTx(t, db, func(tx pgx.Tx) error {
				_, err := outbox.EnqueueBatch(ctx, tx, []outbox.Event{{Topic: "t", EventType: "e", Payload: json.RawMessage(`1`)}, c.ev})
				return err
			})
			checkGo(t, "EnqueueBatch", err, c.wantErr)
			// The SQL functions, which other languages call.
			_, err = db.Pool.Exec(ctx, `SELECT bridge.enqueue($1, $2, $3, $4::jsonb, $5::jsonb)`, c.ev.Topic, c.ev.AssetID, c.ev.EventType, payloadJSON, headers)
			checkSQL(t, "bridge.enqueue", err, "bridge.enqueue: ", c.wantErr)
			_, err = db.Pool.Exec(ctx, `SELECT bridge.enqueue_batch($1::text[], $2::text[], $3::text[], $4::text[]::jsonb[], $5::text[]::jsonb[], $6::text[], $7::text[])`,
				[]string{"t", c.ev.Topic}, []string{"a", c.ev.AssetID}, []string{"e", c.ev.EventType}, []string{"1", payloadJSON},
				[]string{"{}", headers}, []*string{nil, nil}, []*string{nil, nil})
			checkSQL(t, "bridge.enqueue_batch", err, "bridge.enqueue_batch: event 2 (of 2): ", c.wantErr)
		})
	}
}

func checkGo(t *testing.T, what string, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Errorf("%s: %v, want accepted", what, err)
		}
		return
	}
	var be *eventbounds.Error
	if !errors.Is(err, outbox.ErrInvalidEvent) || !errors.As(err, &be) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: err = %v, want ErrInvalidEvent naming %q", what, err, want)
	}
}

func checkSQL(t *testing.T, what string, err error, prefix, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Errorf("%s: %v, want accepted", what, err)
		}
		return
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "22023" || pe.Message != prefix+want {
		t.Errorf("%s: err = %v, want SQLSTATE 22023 %q", what, err, prefix+want)
	}
}

// The SQL copy of the bounds says what the Go copy says.
func TestSQLBoundsMatchGo(t *testing.T) {
	db := pgtest.NewParallel(t)
	for _, c := range boundCases() {
		headers := "{}"
		if c.ev.Headers != nil {
			b, _ := json.Marshal(c.ev.Headers)
			headers = string(b)
		}
		var sqlProblem *string
		if err := db.Pool.QueryRow(context.Background(), `SELECT bridge.check_event_bounds($1, $2, $3, $4::jsonb)`,
			c.ev.Topic, c.ev.AssetID, c.ev.EventType, headers).Scan(&sqlProblem); err != nil {
			t.Fatal(err)
		}
		goErr := eventbounds.Check(c.ev.Topic, c.ev.AssetID, c.ev.EventType, c.ev.Headers)
		switch {
		case sqlProblem == nil && goErr == nil:
		case sqlProblem != nil && goErr != nil && *sqlProblem == goErr.Error():
		default:
			t.Errorf("%s: SQL %v, Go %v", c.name, deref(sqlProblem), goErr)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
