package schema_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxbridge/bridge/internal/schematest"
	"github.com/outboxbridge/bridge/outbox/schema"
)

// AvroOrder exercises every mapping of docs/contract.md's "Avro subjects":
// records (nested), unions as plain values, enum, array, map, bytes, fixed,
// int/long/float/double/boolean, defaults, and the logical types.
const AvroOrder = `{"type":"record","name":"Order","namespace":"bridge.test","fields":[
 {"name":"id","type":"string"},
 {"name":"amount","type":"long"},
 {"name":"qty","type":"int"},
 {"name":"ratio","type":"double"},
 {"name":"weight","type":"float"},
 {"name":"paid","type":"boolean"},
 {"name":"note","type":["null","string"],"default":null},
 {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID","SHIPPED"]}},
 {"name":"tags","type":{"type":"array","items":"string"}},
 {"name":"attrs","type":{"type":"map","values":"long"}},
 {"name":"customer","type":{"type":"record","name":"Customer","fields":[{"name":"name","type":"string"},{"name":"vip","type":"boolean","default":false}]}},
 {"name":"blob","type":"bytes"},
 {"name":"digest","type":{"type":"fixed","name":"Digest","size":4}},
 {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
 {"name":"created","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"day","type":{"type":"int","logicalType":"date"}},
 {"name":"ref","type":{"type":"string","logicalType":"uuid"}},
 {"name":"extra","type":["null","long","string"],"default":null}
]}`

// AvroOrderJSON is a payload that fits AvroOrder, written as the decode
// writes it back (fields in schema order, defaults filled in).
const AvroOrderJSON = `{"id":"o-1","amount":1200,"qty":3,"ratio":0.25,"weight":1.5,"paid":true,"note":"gift","status":"PAID","tags":["a","b"],"attrs":{"k":7},"customer":{"name":"Ann","vip":false},"blob":"aGVsbG8=","digest":"AQIDBA==","price":"-12.30","created":"2026-12-07T01:02:03.456Z","day":"2026-12-07","ref":"6f1c2b9e-3f4a-4c1d-9a7e-0b8d2e5f6a71","extra":"x"}`

func TestAvroValueEncodesAndDecodesBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t, time.Second)
	topic := schematest.Topic(t)
	v1, err := reg.Register(ctx, topic, sr.TypeAvro, AvroOrder, "BACKWARD")
	if err != nil {
		t.Fatal(err)
	}
	// The payload as an application writes it: other member order, the
	// customer's vip left to its default.
	in := `{"customer":{"name":"Ann"},"id":"o-1","amount":1200,"qty":3,"ratio":0.25,"weight":1.5,"paid":true,"note":"gift","status":"PAID","tags":["a","b"],"attrs":{"k":7},"blob":"aGVsbG8=","digest":"AQIDBA==","price":"-12.3","created":"2026-12-07T02:02:03.456+01:00","day":"2026-12-07","ref":"6f1c2b9e-3f4a-4c1d-9a7e-0b8d2e5f6a71","extra":"x"}`
	if err := reg.Validate(ctx, topic, []byte(in)); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	val, err := reg.Value(ctx, topic, []byte(in))
	if err != nil {
		t.Fatalf("Value: %v", err)
	}
	if val[0] != 0 || int(binary.BigEndian.Uint32(val[1:5])) != v1.ID {
		t.Fatalf("value = %x, want 00 + id %d", val[:5], v1.ID)
	}
	if json.Valid(val[5:]) {
		t.Fatalf("value after the framing is JSON (%q), want Avro binary", val[5:])
	}
	// A fresh registry knows nothing: it looks the id up.
	out, err := newRegistry(t, time.Second).DecodeValue(ctx, val)
	if err != nil {
		t.Fatalf("DecodeValue: %v", err)
	}
	if string(out) != AvroOrderJSON {
		t.Fatalf("decoded\n %s\nwant\n %s", out, AvroOrderJSON)
	}
	// Nulls and the other union branch.
	var m map[string]any
	_ = json.Unmarshal([]byte(AvroOrderJSON), &m)
	m["note"], m["extra"] = nil, 42
	in2, _ := json.Marshal(m)
	val, err = reg.Value(ctx, topic, in2)
	if err != nil {
		t.Fatal(err)
	}
	out, err = reg.DecodeValue(ctx, val)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if got["note"] != nil || got["extra"] != float64(42) {
		t.Fatalf("note, extra = %v, %v; want null, 42", got["note"], got["extra"])
	}
	// An ungoverned value passes through DecodeValue untouched.
	if out, err := reg.DecodeValue(ctx, []byte(`{"a":1}`)); err != nil || string(out) != `{"a":1}` {
		t.Fatalf("unframed: %q %v", out, err)
	}
}

func TestAvroRefusalNamesTheField(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t, time.Second)
	topic := schematest.Topic(t)
	if _, err := reg.Register(ctx, topic, sr.TypeAvro, AvroOrder, ""); err != nil {
		t.Fatal(err)
	}
	var base map[string]any
	if err := json.Unmarshal([]byte(AvroOrderJSON), &base); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		field      string
		value      any // nil with del: the field is removed
		del        bool
		path, rule string
	}{
		{field: "amount", value: "twelve", path: "/amount", rule: "type"},
		{field: "qty", value: 1 << 40, path: "/qty", rule: "type"},
		{field: "amount", value: 1.5, path: "/amount", rule: "type"},
		{field: "id", del: true, path: "/id", rule: "required"},
		{field: "surprise", value: 1, path: "/surprise", rule: "unknown-field"},
		{field: "status", value: "LOST", path: "/status", rule: "enum"},
		{field: "customer", value: map[string]any{"name": 5}, path: "/customer/name", rule: "type"},
		{field: "tags", value: []any{"a", 3}, path: "/tags/1", rule: "type"},
		{field: "attrs", value: map[string]any{"k/x": "no"}, path: "/attrs/k~1x", rule: "type"},
		{field: "digest", value: "AQID", path: "/digest", rule: "size"},
		{field: "blob", value: "%%%", path: "/blob", rule: "base64"},
		{field: "price", value: "1.234", path: "/price", rule: "logical-type"},
		{field: "created", value: "yesterday", path: "/created", rule: "logical-type"},
		{field: "day", value: "07/12/2026", path: "/day", rule: "logical-type"},
		{field: "extra", value: true, path: "/extra", rule: "union"},
	} {
		m := map[string]any{}
		for k, v := range base {
			m[k] = v
		}
		if tc.del {
			delete(m, tc.field)
		} else {
			m[tc.field] = tc.value
		}
		payload, _ := json.Marshal(m)
		err := reg.Validate(ctx, topic, payload)
		var ve *schema.ViolationError
		if !errors.As(err, &ve) {
			t.Errorf("%s=%v: err = %v, want a *ViolationError", tc.field, tc.value, err)
			continue
		}
		if ve.Path != tc.path || ve.Rule != tc.rule {
			t.Errorf("%s=%v: at %q rule %q (%v), want at %q rule %q", tc.field, tc.value, ve.Path, ve.Rule, err, tc.path, tc.rule)
		}
		if !strings.Contains(err.Error(), schema.Subject(topic)) {
			t.Errorf("%v does not name the subject", err)
		}
		if _, err := reg.Value(ctx, topic, payload); !reflect.DeepEqual(errors.As(err, &ve), true) {
			t.Errorf("%s: Value accepted what Validate refused", tc.field)
		}
	}
}
