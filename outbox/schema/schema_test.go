package schema_test

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxbridge/bridge/internal/schematest"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/outbox/schema"
)

const orderV1 = `{"type":"object","properties":{"id":{"type":"string"},"amount":{"type":"integer","minimum":0}},"required":["id","amount"],"additionalProperties":false}`

// orderV2 adds an optional property: BACKWARD compatible.
const orderV2 = `{"type":"object","properties":{"id":{"type":"string"},"amount":{"type":"integer","minimum":0},"note":{"type":"string"}},"required":["id","amount"],"additionalProperties":false}`

// orderBad changes a property's type and adds a required one: incompatible.
const orderBad = `{"type":"object","properties":{"id":{"type":"integer"},"amount":{"type":"integer"},"currency":{"type":"string"}},"required":["id","amount","currency"],"additionalProperties":false}`

func newRegistry(t *testing.T, refresh time.Duration) *schema.Registry {
	t.Helper()
	reg, err := schema.New(schema.Config{URL: schematest.URL(t), RefreshInterval: refresh})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// Register, evolve compatibly, and have an incompatible change refused with
// the registry's own reason; the registry keeps both good versions.
func TestRegisterEvolveAndRefuseIncompatible(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t, time.Second)
	topic := schematest.Topic(t)

	v1, err := reg.Register(ctx, topic, sr.TypeJSON, orderV1, "BACKWARD")
	if err != nil {
		t.Fatalf("register v1: %v", err)
	}
	v2, err := reg.Register(ctx, topic, sr.TypeJSON, orderV2, "")
	if err != nil {
		t.Fatalf("register a compatible v2: %v", err)
	}
	if v2.Version != v1.Version+1 || v2.ID == v1.ID {
		t.Fatalf("v2 = version %d id %d, want version %d and a new id (v1 id %d)", v2.Version, v2.ID, v1.Version+1, v1.ID)
	}
	_, err = reg.Register(ctx, topic, sr.TypeJSON, orderBad, "")
	var re *sr.ResponseError
	if !errors.As(err, &re) {
		t.Fatalf("register an incompatible schema: err = %v, want the registry's refusal", err)
	}
	if re.StatusCode != 409 || !strings.Contains(re.Message, "Incompatible") {
		t.Fatalf("refusal = %d %q, want 409 with the registry's incompatibility reason", re.StatusCode, re.Message)
	}
	for _, want := range []string{"/properties/id", "/required"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name the incompatible change at %s", err, want)
		}
	}
	versions, err := reg.History(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(versions) != 2 || versions[1].ID != v2.ID {
		t.Fatalf("versions after the refusal = %+v, want v1 and v2 only", versions)
	}
	topics, err := reg.Topics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !contains(topics, topic) {
		t.Fatalf("Topics() = %v, want it to list %s", topics, topic)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A bad payload is refused naming the schema, the path and the rule; a good
// one is framed with magic byte 0 and the schema id, then the JSON as given.
func TestValueValidatesAndFrames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t, time.Second)
	topic := schematest.Topic(t)
	v1, err := reg.Register(ctx, topic, sr.TypeJSON, orderV1, "BACKWARD")
	if err != nil {
		t.Fatal(err)
	}

	good := []byte(`{"id":"o-1","amount":12}`)
	val, err := reg.Value(ctx, topic, good)
	if err != nil {
		t.Fatalf("good payload: %v", err)
	}
	if val[0] != 0 || int(binary.BigEndian.Uint32(val[1:5])) != v1.ID || string(val[5:]) != string(good) {
		t.Fatalf("value = %x, want 00 + id %d (big-endian) + the payload", val, v1.ID)
	}
	id, payload, ok := schema.Unframe(val)
	if !ok || id != v1.ID || string(payload) != string(good) {
		t.Fatalf("Unframe = %d %q %v", id, payload, ok)
	}

	for _, tc := range []struct {
		payload    string
		path, rule string
	}{
		{`{"id":"o-1","amount":"twelve"}`, "/amount", "type"},
		{`{"id":"o-1","amount":-3}`, "/amount", "minimum"},
		{`{"id":"o-1"}`, "/", "required"},
		{`{"id":"o-1","amount":1,"extra":true}`, "/", "additionalProperties"},
		{`{"id":"o-1",`, "/", "json"},
	} {
		_, err := reg.Value(ctx, topic, []byte(tc.payload))
		var ve *schema.ViolationError
		if !errors.As(err, &ve) || !errors.Is(err, schema.ErrViolation) {
			t.Errorf("%s: err = %v, want a *ViolationError", tc.payload, err)
			continue
		}
		msg := err.Error()
		for _, want := range []string{schema.Subject(topic), "version 1", "at " + tc.path + ":", `rule "` + tc.rule + `"`} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: %q does not contain %q", tc.payload, msg, want)
			}
		}
	}

	// An ungoverned topic's payload goes out as it is, whatever it holds.
	plain := []byte(`{"anything":1}`)
	out, err := reg.Value(ctx, schematest.Topic(t), plain)
	if err != nil || string(out) != string(plain) {
		t.Fatalf("ungoverned: %q %v, want the payload untouched", out, err)
	}
	if _, _, ok := schema.Unframe(plain); ok {
		t.Fatal("Unframe took plain JSON for a framed value")
	}
}

// A version registered while the Registry is in use (here by someone else:
// another client) is in force within the refresh interval, without a new
// Registry.
func TestSchemaChangePickedUpWithoutRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t, 300*time.Millisecond)
	other := newRegistry(t, time.Hour)
	topic := schematest.Topic(t)

	withNote := []byte(`{"id":"o-1","amount":1,"note":"gift"}`)
	if err := reg.Validate(ctx, topic, withNote); err != nil {
		t.Fatalf("ungoverned topic: %v", err)
	}
	if _, err := other.Register(ctx, topic, sr.TypeJSON, orderV1, "BACKWARD"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() string {
		return testkit.Unless(errors.Is(reg.Validate(ctx, topic, withNote), schema.ErrViolation), "v1 (no note) not in force yet")
	})
	if _, err := other.Register(ctx, topic, sr.TypeJSON, orderV2, ""); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() string {
		if err := reg.Validate(ctx, topic, withNote); err != nil {
			return "v2 (note allowed) not in force yet: " + err.Error()
		}
		return ""
	})
}

// A subject of a type the bridge does not validate is refused, never let
// through unvalidated.
func TestUnsupportedSchemaTypeRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t, time.Second)
	topic := schematest.Topic(t)
	if _, err := reg.Register(ctx, topic, sr.TypeProtobuf, "syntax = \"proto3\";\nmessage Order { string id = 1; }\n", ""); err != nil {
		t.Fatal(err)
	}
	_, err := reg.Value(ctx, topic, []byte(`{"id":"o-1"}`))
	if !errors.Is(err, schema.ErrViolation) || !strings.Contains(err.Error(), `rule "schema-type"`) || !strings.Contains(err.Error(), "PROTOBUF") {
		t.Fatalf("err = %v, want a schema-type violation naming PROTOBUF", err)
	}
}

// A registry that cannot be reached is not the payload's fault.
func TestUnreachableRegistryIsNotAViolation(t *testing.T) {
	t.Parallel()
	reg, err := schema.New(schema.Config{URL: "http://127.0.0.1:1/apis/ccompat/v7", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = reg.Validate(context.Background(), "orders", []byte(`{}`))
	if err == nil || errors.Is(err, schema.ErrViolation) {
		t.Fatalf("err = %v, want a registry error that is not a violation", err)
	}
}
