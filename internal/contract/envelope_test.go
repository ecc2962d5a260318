package contract

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// encoderMarshal is the envelope as encoding/json's Encoder writes it
// without HTML escaping: the bytes Marshal must produce.
func encoderMarshal(t *testing.T, e Envelope) ([]byte, error) {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(e); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}

func TestEnvelopeMarshalIsTheEncodersBytes(t *testing.T) {
	asset, odd := "asset-1", "a\"b\\c<d>&e\u2028f\u2029g\x01h\xffi é 日本"
	seq := int64(-42)
	created := time.Date(2026, 1, 2, 3, 4, 5, 600, time.FixedZone("x", 3600))
	payloads := []string{`{"a":1}`, "{ \"a\" : [1, 2,\n 3], \"b\":\"<&>\\u2028 \u2028\" }", `"s"`, `null`, `12.5e3`,
		`{"x":"\u00e9\ud83d\ude00"}`, "[]"}
	for _, id := range []string{"0192-abc", odd, ""} {
		for _, a := range []*string{nil, &asset, &odd} {
			for _, sq := range []*int64{nil, &seq} {
				for _, p := range payloads {
					e := NewEnvelope(id, odd, a, sq, created, []byte(p))
					got, err := e.Marshal()
					if err != nil {
						t.Fatalf("Marshal(%q, %q): %v", id, p, err)
					}
					want, _ := encoderMarshal(t, e)
					if !bytes.Equal(got, want) {
						t.Fatalf("Marshal differs from the encoder\n got %s\nwant %s", got, want)
					}
				}
			}
		}
	}
	e := NewEnvelope("id", "t", nil, nil, created, nil)
	got, _ := e.Marshal()
	want, _ := encoderMarshal(t, e)
	if !bytes.Equal(got, want) {
		t.Fatalf("nil payload: got %s, want %s", got, want)
	}
	for _, bad := range []string{"", "{", `{"a":}`, "nope"} {
		if _, err := NewEnvelope("id", "t", nil, nil, created, []byte(bad)).Marshal(); err == nil {
			t.Fatalf("payload %q: Marshal accepted JSON the encoder refuses", bad)
		}
	}
}

func FuzzEnvelopeMarshalIsTheEncodersBytes(f *testing.F) {
	f.Add("id", "type", "asset", int64(1), []byte(`{"a":"<b>"}`))
	f.Add("\x00\u2028", "\xfe", "", int64(-1), []byte(" [ 1 , 2 ] "))
	f.Fuzz(func(t *testing.T, id, typ, asset string, seq int64, payload []byte) {
		e := NewEnvelope(id, typ, &asset, &seq, time.Unix(seq, 0), payload)
		got, err := e.Marshal()
		want, werr := encoderMarshal(t, e)
		if (err == nil) != (werr == nil) {
			t.Fatalf("Marshal error %v, encoder error %v", err, werr)
		}
		if err == nil && !bytes.Equal(got, want) {
			t.Fatalf("Marshal differs from the encoder\n got %q\nwant %q", got, want)
		}
	})
}
