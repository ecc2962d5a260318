package contract_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/schematest"
	"github.com/outboxbridge/bridge/outbox/schema"
)

// A governed topic's record (Confluent framing: magic byte 0, a 4-byte
// schema id, then the JSON) decodes to the JSON alone, so the webhook body
// is the same as for an ungoverned topic; framing around something that is
// not JSON is still refused.
func TestDecodeUnframesGovernedValue(t *testing.T) {
	payload := `{"id":"o-1","amount":10}`
	rec := contract.Encode(contract.Event{DedupID: "d-1", Topic: "orders", EventType: "order.placed", AssetSeq: 1, Payload: []byte(payload)})
	rec.Value = append([]byte{0, 0, 0, 1, 7}, payload...)
	m, err := contract.Decode(rec)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if string(m.Payload) != payload {
		t.Fatalf("payload = %q, want %q", m.Payload, payload)
	}
	rec.Value = []byte{0, 0, 0, 1, 7, 0x02, 0x06, 'a', 'b', 'c'} // an Avro body
	if _, err := contract.Decode(rec); err == nil {
		t.Fatal("Decode accepted a framed value that is not JSON")
	}
}

// An Avro-governed topic's record (the relay wrote the JSON payload as Avro
// binary) decodes, with the registry as the ValueDecoder, to the same JSON,
// so the webhook body carries the payload as enqueued; without a decoder
// it is refused (dead-lettered), never delivered as binary.
func TestDecodeWithReadsAvroBackToJSON(t *testing.T) {
	ctx := context.Background()
	reg, err := schema.New(schema.Config{URL: schematest.URL(t)})
	if err != nil {
		t.Fatal(err)
	}
	topic := schematest.Topic(t)
	if _, err := reg.Register(ctx, topic, sr.TypeAvro,
		`{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"amount","type":"long"},{"name":"note","type":["null","string"],"default":null},{"name":"lines","type":{"type":"array","items":{"type":"record","name":"Line","fields":[{"name":"sku","type":"string"},{"name":"qty","type":"int"}]}}}]}`, ""); err != nil {
		t.Fatal(err)
	}
	payload := `{"id":"o-1","amount":10,"note":null,"lines":[{"sku":"a","qty":2},{"sku":"b","qty":1}]}`
	value, err := reg.Value(ctx, topic, []byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	rec := contract.Encode(contract.Event{DedupID: "d-1", Topic: topic, EventType: "order.placed", AssetSeq: 1, Payload: []byte(payload)})
	rec.Value = value
	if _, err := contract.Decode(rec); err == nil {
		t.Fatal("Decode without a ValueDecoder accepted Avro binary")
	}
	// A decoder that has not seen the schema looks its id up.
	fresh, err := schema.New(schema.Config{URL: schematest.URL(t)})
	if err != nil {
		t.Fatal(err)
	}
	m, err := contract.DecodeWith(ctx, rec, fresh)
	if err != nil {
		t.Fatalf("DecodeWith: %v", err)
	}
	if string(m.Payload) != payload {
		t.Fatalf("payload = %s, want %s", m.Payload, payload)
	}
	body, err := contract.NewEnvelope(m.DedupID, m.EventType, m.AssetID, m.AssetSeq, m.CreatedAt, m.Payload).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	env, err := contract.ParseEnvelope(body)
	if err != nil {
		t.Fatalf("webhook body %s: %v", body, err)
	}
	if string(env.Data) != payload {
		t.Fatalf("webhook body data = %s, want %s", env.Data, payload)
	}
	// An id the registry does not have: a DecodeError (dead letter) naming it.
	rec.Value = append([]byte{0, 0x7f, 0xff, 0xff, 0xf0}, value[5:]...)
	_, err = contract.DecodeWith(ctx, rec, fresh)
	var de *contract.DecodeError
	if !errors.As(err, &de) || !strings.Contains(de.Reason, "schema id 2147483632") {
		t.Fatalf("unknown schema id: err = %v, want a DecodeError naming the id", err)
	}
}
