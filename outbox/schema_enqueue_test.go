package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/schematest"
	"github.com/outboxbridge/bridge/outbox"
	"github.com/outboxbridge/bridge/outbox/schema"
)

// With outbox.Schemas set, Enqueue and EnqueueBatch refuse a payload that
// does not match its governed topic's schema (naming the schema, the path and
// the rule) and write nothing; a matching payload and an ungoverned topic go
// in as before. Not parallel: outbox.Schemas is the package's one setting.
func TestEnqueueRefusesPayloadAgainstSchema(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t)
	reg, err := schema.New(schema.Config{URL: schematest.URL(t), RefreshInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	topic := schematest.Topic(t)
	if _, err := reg.Register(ctx, topic, sr.TypeJSON,
		`{"type":"object","properties":{"sku":{"type":"string","minLength":3},"qty":{"type":"integer"}},"required":["sku","qty"]}`, "BACKWARD"); err != nil {
		t.Fatal(err)
	}
	outbox.Schemas = reg
	t.Cleanup(func() { outbox.Schemas = nil })

	bad := outbox.Event{Topic: topic, AssetID: "s-1", EventType: "stock.changed", Payload: json.RawMessage(`{"sku":"ab","qty":1}`)}
	err = inTx(t, db, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, bad)
		return err
	})
	if !errors.Is(err, outbox.ErrInvalidEvent) || !errors.Is(err, schema.ErrViolation) {
		t.Fatalf("Enqueue(bad) = %v, want ErrInvalidEvent and a schema violation", err)
	}
	for _, want := range []string{schema.Subject(topic), "version 1", "at /sku:", `rule "minLength"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not contain %q", err, want)
		}
	}

	good := outbox.Event{Topic: topic, AssetID: "s-1", EventType: "stock.changed", Payload: json.RawMessage(`{"sku":"abc","qty":1}`)}
	plain := outbox.Event{Topic: schematest.Topic(t), AssetID: "s-1", EventType: "free", Payload: json.RawMessage(`{"sku":1}`)}
	err = inTx(t, db, func(tx pgx.Tx) error {
		_, err := outbox.EnqueueBatch(ctx, tx, []outbox.Event{good, plain, bad})
		return err
	})
	if !errors.Is(err, schema.ErrViolation) || !strings.HasPrefix(err.Error(), "event 2: ") {
		t.Fatalf("EnqueueBatch with a bad third event = %v, want its violation, numbered", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.outbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows written by refused calls: %d (%v)", n, err)
	}
	err = inTx(t, db, func(tx pgx.Tx) error {
		_, err := outbox.EnqueueBatch(ctx, tx, []outbox.Event{good, plain})
		return err
	})
	if err != nil {
		t.Fatalf("EnqueueBatch(good, ungoverned) = %v", err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.outbox`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows written: %d (%v), want 2", n, err)
	}
}

// An Avro subject: Enqueue converts the JSON payload with the schema and
// refuses one that does not fit, naming the field and the rule; a fitting
// one is written (as the JSON it is). Not parallel: outbox.Schemas.
func TestEnqueueRefusesPayloadAgainstAvroSchema(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t)
	reg, err := schema.New(schema.Config{URL: schematest.URL(t), RefreshInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	topic := schematest.Topic(t)
	if _, err := reg.Register(ctx, topic, sr.TypeAvro,
		`{"type":"record","name":"Stock","fields":[{"name":"sku","type":"string"},{"name":"qty","type":"int"},{"name":"site","type":{"type":"record","name":"Site","fields":[{"name":"code","type":"string"}]}}]}`, "BACKWARD"); err != nil {
		t.Fatal(err)
	}
	outbox.Schemas = reg
	t.Cleanup(func() { outbox.Schemas = nil })

	for payload, want := range map[string][]string{
		`{"sku":"abc","qty":"one","site":{"code":"x"}}`:           {"at /qty:", `rule "type"`},
		`{"sku":"abc","qty":1,"site":{}}`:                         {"at /site/code:", `rule "required"`, `"code"`},
		`{"sku":"abc","qty":1,"site":{"code":"x"},"color":"red"}`: {"at /color:", `rule "unknown-field"`},
	} {
		err = inTx(t, db, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: topic, AssetID: "s-1", EventType: "stock.changed", Payload: json.RawMessage(payload)})
			return err
		})
		if !errors.Is(err, outbox.ErrInvalidEvent) || !errors.Is(err, schema.ErrViolation) {
			t.Fatalf("Enqueue(%s) = %v, want ErrInvalidEvent and a schema violation", payload, err)
		}
		for _, w := range append(want, schema.Subject(topic)) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q does not contain %q", err, w)
			}
		}
	}
	err = inTx(t, db, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: topic, AssetID: "s-1", EventType: "stock.changed", Payload: json.RawMessage(`{"sku":"abc","qty":1,"site":{"code":"x"}}`)})
		return err
	})
	if err != nil {
		t.Fatalf("Enqueue(good) = %v", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.outbox`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows written: %d (%v), want 1", n, err)
	}
}
