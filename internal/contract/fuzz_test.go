package contract

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// FuzzDecode: any Kafka record decodes without panicking; a decoded
// message's text fields are valid UTF-8 without NUL (they go into text
// columns) and its value is valid JSON (it becomes jsonb); a record that is
// refused still carries a dedup id to dead-letter it under.
func FuzzDecode(f *testing.F) {
	f.Add([]byte("asset-1"), []byte(`{"v":1}`), "0b7c6a4e-5f0e-4f43-9d4c-2f3f0f6b8e11", "asset.created", "3", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v")
	f.Add([]byte(nil), []byte(`not json`), "", "", "x", "garbage", "")
	f.Add([]byte("a"), []byte("{\"v\":\"\x00\"}"), "id", "t\x00", "-1", "", "")
	f.Fuzz(func(t *testing.T, key, value []byte, dedup, eventType, assetSeq, tp, ts string) {
		r := &kgo.Record{Topic: "t", Key: key, Value: value, Headers: []kgo.RecordHeader{
			{Key: HeaderDedupID, Value: []byte(dedup)}, {Key: HeaderEventType, Value: []byte(eventType)},
			{Key: HeaderAssetSeq, Value: []byte(assetSeq)}, {Key: HeaderTraceparent, Value: []byte(tp)},
			{Key: HeaderTracestate, Value: []byte(ts)}, {Key: HeaderDedupID, Value: []byte("shadow")},
		}}
		m, err := Decode(r)
		if err != nil {
			var de *DecodeError
			if !asDecodeError(err, &de) {
				t.Fatalf("Decode error %T is not a *DecodeError: %v", err, err)
			}
			if m.DedupID == "" {
				t.Fatal("a refused record has no dedup id to dead-letter it under")
			}
			return
		}
		for name, s := range map[string]string{"dedup id": m.DedupID, "event type": m.EventType, "traceparent": m.Traceparent, "tracestate": m.Tracestate} {
			if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
				t.Fatalf("decoded %s %q is not storable text", name, s)
			}
		}
		if !json.Valid(m.Payload) {
			t.Fatalf("decoded value %q is not JSON", m.Payload)
		}
	})
}

func asDecodeError(err error, target **DecodeError) bool {
	de, ok := err.(*DecodeError)
	*target = de
	return ok
}

// FuzzParseEnvelope: any body parses or is refused without panicking; an
// envelope that parses marshals and parses back to the same envelope.
func FuzzParseEnvelope(f *testing.F) {
	f.Add([]byte(`{"id":"e1","type":"asset.created","timestamp":"2026-01-01T00:00:00Z","data":{"a":1}}`))
	f.Add([]byte(`{"id":"","type":"x"}`))
	f.Add([]byte(`[1,2]`))
	f.Add([]byte(`{"id":"e","type":"t","data":null,"asset_id":"a","asset_seq":3}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		e, err := ParseEnvelope(body)
		if err != nil {
			return
		}
		out, err := e.Marshal()
		if err != nil {
			return // data that is not JSON cannot be re-sent; refused by Marshal
		}
		e2, err := ParseEnvelope(out)
		if err != nil {
			t.Fatalf("marshalled envelope %s does not parse: %v", out, err)
		}
		out2, _ := e2.Marshal()
		if !bytes.Equal(out, out2) {
			t.Fatalf("envelope does not round-trip:\n%s\n%s", out, out2)
		}
	})
}
