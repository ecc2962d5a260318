package contract

import (
	"bytes"
	"encoding/json"
	"reflect"
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

// FuzzParseEnvelopeFastPathIsUnmarshal: whenever the fast path reads a body,
// encoding/json reads it too and to the same envelope — so the fast path
// never accepts what the decoder refuses, nor reads a field differently.
// Bodies are arbitrary, and Marshal's own output for fuzzed fields (the
// shape the fast path exists for, which it must then read).
func FuzzParseEnvelopeFastPathIsUnmarshal(f *testing.F) {
	f.Add([]byte(`{"id":"e1","type":"asset.created","asset_id":"a-1","asset_seq":7,"timestamp":"2026-01-01T00:00:00Z","data":{"a":1}}`),
		"e1", "t", "a", int64(1), "2026-01-01T00:00:00.5Z", []byte(`{"a":[1,2]}`), true)
	f.Add([]byte(`{"id":"e1","type":"t","asset_id":null,"asset_seq":null,"timestamp":"x","data":null}`),
		"", "t", "", int64(0), "", []byte(`null`), false)
	f.Add([]byte(`{"id":"e1","type":"t","asset_id":null,"asset_seq":01,"timestamp":"x","data":1}`),
		"é", "t\"", "a\\b", int64(-1), "x", []byte(` {"a" : 1} `), true)
	f.Add([]byte(`{"id":"e1","type":"t","asset_id":null,"asset_seq":-0,"timestamp":"x","data":{} }`),
		"e", "t", "a", int64(9223372036854775807), "x", []byte(`"s"`), true)
	f.Add([]byte(`{"id":"e1","type":"t","asset_id":null,"asset_seq":1e3,"timestamp":"x","data":{}}`),
		"e", "t", "a", int64(-9223372036854775808), "x", []byte(`[]`), false)
	f.Add([]byte(`{"id":"e1","type":"t","asset_id":null,"asset_seq":99999999999999999999,"timestamp":"x","data":{}},"id":"b"}`),
		"e", "t", "a", int64(0), "x", []byte(`{"a":1},"b":{`), true)
	f.Fuzz(func(t *testing.T, body []byte, id, typ, asset string, seq int64, ts string, data []byte, hasAsset bool) {
		check := func(b []byte) (read bool) {
			t.Helper()
			fast, ok := parseEnvelopeFast(b)
			if !ok {
				return false
			}
			var slow Envelope
			if err := json.Unmarshal(b, &slow); err != nil {
				t.Fatalf("fast path read %q, encoding/json refuses it: %v", b, err)
			}
			if !reflect.DeepEqual(fast, slow) {
				t.Fatalf("fast path and encoding/json differ on %q:\nfast %+v\njson %+v", b, fast, slow)
			}
			return true
		}
		check(body)
		var a *string
		if hasAsset {
			a = &asset
		}
		e := Envelope{ID: id, Type: typ, AssetID: a, AssetSeq: &seq, Timestamp: ts, Data: data}
		out, err := e.Marshal()
		if err != nil {
			return
		}
		read := check(out)
		plain := func(s string) bool {
			for i := 0; i < len(s); i++ {
				if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
					return false
				}
			}
			return true
		}
		if !read && plain(id) && plain(typ) && (!hasAsset || plain(asset)) && plain(ts) {
			t.Fatalf("fast path did not read Marshal's own output %q", out)
		}
	})
}
