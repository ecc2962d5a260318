package contract_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata from the current code")

// golden compares got with testdata/name, or rewrites it under -update. A
// difference is a change of the wire format: every producer and receiver of
// it must change together, and docs/contract.md with them.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/contract -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s changed: this is the wire format.\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func ptr[T any](v T) *T { return &v }

// dumpRecord writes a record as text, one line per field and header, in
// header order (the order is part of the contract: first occurrence wins).
func dumpRecord(r *kgo.Record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "topic: %s\n", r.Topic)
	fmt.Fprintf(&b, "key: %q (nil: %v)\n", r.Key, r.Key == nil)
	for _, h := range r.Headers {
		fmt.Fprintf(&b, "header %s: %s\n", h.Key, h.Value)
	}
	fmt.Fprintf(&b, "value: %s\n", r.Value)
	return b.String()
}

var goldenEvents = []contract.Event{
	{
		DedupID: "0195f3a4-7b1c-7d2e-9f00-1a2b3c4d5e6f", Topic: "assets", AssetID: ptr("asset-42"), AssetSeq: 7,
		EventType: "asset.version_published", Payload: []byte(`{"asset":"asset-42","version":3,"note":"<b>&</b>"}`),
		// A row header may not shadow the bridge's: dedup-id and
		// content-type here are dropped, the rest follow in name order.
		Headers: map[string]string{"tenant": "acme", "dedup-id": "forged", "content-type": "text/plain", "correlation-id": "c-1"},
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Tracestate: "vendor=v1",
	},
	{
		// The null asset, no trace, no headers of its own.
		DedupID: "0195f3a4-7b1c-7d2e-9f00-000000000001", Topic: "assets", AssetSeq: 1,
		EventType: "system.tick", Payload: []byte(`{}`),
	},
	{
		// RELAY_CLOUDEVENTS=binary: the ce_ headers follow the bridge's, and
		// a row header cannot shadow them, nor the bridge's created-at.
		DedupID: "0195f3a4-7b1c-7d2e-9f00-000000000002", Topic: "assets", AssetID: ptr("asset-42"), AssetSeq: 8,
		EventType: "asset.expired", Payload: []byte(`{"asset":"asset-42"}`),
		Headers:   map[string]string{"ce_type": "forged", "tenant": "acme", "created-at": "1999-01-01T00:00:00Z"},
		CreatedAt: time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC), CloudEventsSource: "https://shop.example.com/assets",
	},
}

func TestKafkaRecordGolden(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	for i, ev := range goldenEvents {
		if i > 0 {
			out.WriteString("\n")
		}
		out.WriteString(dumpRecord(contract.Encode(ev)))
	}
	golden(t, "kafka_record.golden", []byte(out.String()))
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, ev := range goldenEvents {
		rec := contract.Encode(ev)
		if rec.Key == nil {
			t.Fatalf("%s: nil key; the null asset must be an empty, non-nil key (a nil key is spread over partitions)", ev.DedupID)
		}
		rec.Timestamp = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		m, err := contract.Decode(rec)
		if err != nil {
			t.Fatalf("%s: %v", ev.DedupID, err)
		}
		if m.DedupID != ev.DedupID || m.EventType != ev.EventType || m.Traceparent != ev.Traceparent ||
			m.Tracestate != ev.Tracestate || !bytes.Equal(m.Payload, ev.Payload) {
			t.Errorf("decoded %+v from %+v", m, ev)
		}
		// The event's creation time comes back from created-at; an event
		// without one has the record's timestamp.
		wantCreated := ev.CreatedAt
		if wantCreated.IsZero() {
			wantCreated = rec.Timestamp
		}
		if !m.CreatedAt.Equal(wantCreated) {
			t.Errorf("%s: created at %v, want %v", ev.DedupID, m.CreatedAt, wantCreated)
		}
		if (m.AssetID == nil) != (ev.AssetID == nil) || (m.AssetID != nil && *m.AssetID != *ev.AssetID) {
			t.Errorf("asset %v, want %v", m.AssetID, ev.AssetID)
		}
		if m.AssetSeq == nil || *m.AssetSeq != ev.AssetSeq {
			t.Errorf("asset-seq %v, want %d", m.AssetSeq, ev.AssetSeq)
		}
	}
}

func TestDecodeRefusesWhatCannotBeStored(t *testing.T) {
	t.Parallel()
	base := func() *kgo.Record {
		r := contract.Encode(goldenEvents[0])
		r.Partition, r.Offset = 3, 99
		return r
	}
	setHeader := func(r *kgo.Record, key, value string) {
		for i := range r.Headers {
			if r.Headers[i].Key == key {
				r.Headers[i].Value = []byte(value)
			}
		}
	}
	cases := []struct {
		name     string
		edit     func(*kgo.Record)
		reason   string
		fallback bool // the dedup id is topic/partition/offset
	}{
		{"no event-type", func(r *kgo.Record) {
			r.Headers = slices.DeleteFunc(r.Headers, func(h kgo.RecordHeader) bool { return h.Key == contract.HeaderEventType })
		}, "no event-type header", false},
		{"value not JSON", func(r *kgo.Record) { r.Value = []byte("not json") }, "value is not valid JSON", false},
		{"key not text", func(r *kgo.Record) { r.Key = []byte{0xff, 0} }, "key is not UTF-8 text", false},
		{"header not text", func(r *kgo.Record) { setHeader(r, contract.HeaderEventType, "a\x00b") }, "header event-type is not UTF-8 text", true},
		{"asset-seq not a number", func(r *kgo.Record) { setHeader(r, contract.HeaderAssetSeq, "-1") }, `asset-seq header "-1" is not a non-negative decimal integer`, false},
		{"dedup-id past its bound", func(r *kgo.Record) { setHeader(r, contract.HeaderDedupID, strings.Repeat("d", 3000)) },
			"header dedup-id is 3000 bytes long; at most 512 are allowed", true},
		{"dedup-id with a control character", func(r *kgo.Record) { setHeader(r, contract.HeaderDedupID, "id\r\nX-Injected: 1") },
			`header dedup-id "id\r\nX-Injected: 1" contains a control character`, true},
		{"event-type past its bound", func(r *kgo.Record) { setHeader(r, contract.HeaderEventType, strings.Repeat("e", 257)) },
			"header event-type is 257 bytes long; at most 256 are allowed", false},
		{"key past its bound", func(r *kgo.Record) { r.Key = []byte(strings.Repeat("k", 2680)) },
			"key (the asset id) is 2680 bytes long; at most 512 are allowed", false},
		{"no dedup-id", func(r *kgo.Record) {
			r.Headers = slices.DeleteFunc(r.Headers, func(h kgo.RecordHeader) bool { return h.Key == contract.HeaderDedupID })
			r.Value = []byte("{")
		}, "value is not valid JSON", true},
	}
	for _, c := range cases {
		r := base()
		c.edit(r)
		m, err := contract.Decode(r)
		var de *contract.DecodeError
		if !errors.As(err, &de) || de.Reason != c.reason {
			t.Errorf("%s: error %v, want reason %q", c.name, err, c.reason)
		}
		want := goldenEvents[0].DedupID
		if c.fallback {
			want = "assets/3/99"
		}
		if m.DedupID != want {
			t.Errorf("%s: dedup id %q, want %q", c.name, m.DedupID, want)
		}
	}
}

func TestDecodeFirstHeaderWins(t *testing.T) {
	t.Parallel()
	r := contract.Encode(goldenEvents[1])
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: contract.HeaderDedupID, Value: []byte("second")})
	m, err := contract.Decode(r)
	if err != nil || m.DedupID != goldenEvents[1].DedupID {
		t.Fatalf("dedup id %q (%v), want the first header's %q", m.DedupID, err, goldenEvents[1].DedupID)
	}
	if m.AssetID != nil {
		t.Errorf("empty key decoded as asset %q, want the null asset", *m.AssetID)
	}
}

// The event's time is the created-at header whatever the record's timestamp
// (every copy of an event carries the same), the record's timestamp for a
// record without a usable one: a created-at that does not parse is not a
// reason to dead-letter the record.
func TestDecodeCreatedAt(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)
	produced := time.Date(2026, 3, 1, 12, 5, 0, 0, time.UTC)
	withHeader := func(value string) *kgo.Record {
		ev := goldenEvents[0]
		ev.CreatedAt = created
		r := contract.Encode(ev)
		r.Timestamp = produced
		for i := range r.Headers {
			if r.Headers[i].Key == contract.HeaderCreatedAt {
				r.Headers[i].Value = []byte(value)
			}
		}
		return r
	}
	noHeader := contract.Encode(goldenEvents[0])
	noHeader.Timestamp = produced
	if slices.ContainsFunc(noHeader.Headers, func(h kgo.RecordHeader) bool { return h.Key == contract.HeaderCreatedAt }) {
		t.Fatalf("an event without a creation time got a %s header", contract.HeaderCreatedAt)
	}
	cases := []struct {
		name string
		rec  *kgo.Record
		want time.Time
	}{
		{"header", withHeader(created.Format(time.RFC3339Nano)), created},
		{"header with an offset", withHeader("2026-03-01T13:00:00.123456+01:00"), created},
		{"no header", noHeader, produced},
		{"header not RFC 3339", withHeader("yesterday"), produced},
		{"header not text", withHeader("\xff\x00"), produced},
		{"empty header", withHeader(""), produced},
	}
	for _, c := range cases {
		m, err := contract.Decode(c.rec)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !m.CreatedAt.Equal(c.want) {
			t.Errorf("%s: created at %v, want %v", c.name, m.CreatedAt, c.want)
		}
	}
	// The first created-at wins, as for every bridge header.
	r := withHeader(created.Format(time.RFC3339Nano))
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: contract.HeaderCreatedAt, Value: []byte(produced.Format(time.RFC3339Nano))})
	if m, err := contract.Decode(r); err != nil || !m.CreatedAt.Equal(created) {
		t.Errorf("two created-at headers: created at %v (%v), want the first's %v", m.CreatedAt, err, created)
	}
}

// The webhook request as the deliverer builds it: the envelope, signed with
// the bridge's signing code, with the contract's headers. The official
// Standard Webhooks verifier must accept it.
func TestWebhookRequestGolden(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	ev := goldenEvents[0]
	created := time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)
	body, err := contract.NewEnvelope(ev.DedupID, ev.EventType, ev.AssetID, ptr(ev.AssetSeq), created, ev.Payload).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	const ts = 1772366460
	sig, err := delivery.Sign([]string{secret}, ev.DedupID, ts, body)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	contract.SetWebhookHeaders(h, ev.DedupID, ts, sig, "outbox-bridge/v1.2.3")
	h.Set(contract.HeaderTraceparent, ev.Traceparent)

	var out bytes.Buffer
	out.WriteString("POST /hooks HTTP/1.1\n")
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&out, "%s: %s\n", strings.ToLower(k), h.Get(k))
	}
	out.WriteString("\n")
	out.Write(body)
	out.WriteString("\n")
	golden(t, "webhook_request.golden", out.Bytes())

	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	if err := wh.VerifyIgnoringTimestamp(body, h); err != nil {
		t.Errorf("the official verifier refuses the request: %v", err)
	}
	env, err := contract.ParseEnvelope(body)
	if err != nil || env.ID != h.Get(contract.HeaderWebhookID) || env.AssetKey() != "asset-42" || *env.AssetSeq != 7 {
		t.Fatalf("parse back: %+v, %v", env, err)
	}
	if c, err := env.Created(); err != nil || !c.Equal(created) {
		t.Errorf("created %v (%v), want %v", c, err, created)
	}
}

func TestParseEnvelopeRefusesOtherBodies(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{"hello":"world"}`, `[]`, `not json`, `{"id":"x"}`} {
		if _, err := contract.ParseEnvelope([]byte(body)); err == nil {
			t.Errorf("ParseEnvelope(%s) = nil error", body)
		}
	}
}
