package contract_test

import (
	"testing"

	"github.com/outboxbridge/bridge/internal/contract"
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
