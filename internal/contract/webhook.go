package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Header names of the webhook request (docs/contract.md, "Webhook request").
// content-type and traceparent are the same names as on the Kafka record
// (HeaderContentType, HeaderTraceparent).
const (
	HeaderWebhookID        = "webhook-id"
	HeaderWebhookTimestamp = "webhook-timestamp"
	HeaderWebhookSignature = "webhook-signature"
	HeaderUserAgent        = "user-agent"
)

// SetWebhookHeaders sets the headers the bridge signs and sends with every
// webhook request: webhook-id (the dedup id, so a receiver deduplicates
// retries on it), webhook-timestamp (Unix seconds of this attempt, which the
// signature covers, so a replayed request ages out of the receiver's
// tolerance), webhook-signature, content-type and user-agent. traceparent is
// injected by the HTTP client's propagator.
//
// The five values share one backing array (one allocation per request, not
// five); each header's slice is capped at its one value, so an append to a
// header copies instead of overwriting the next one.
func SetWebhookHeaders(h http.Header, webhookID string, timestamp int64, signature, userAgent string) {
	v := &[5]string{ContentTypeJSON, userAgent, webhookID, strconv.FormatInt(timestamp, 10), signature}
	h[canonContentType] = v[0:1:1]
	h[canonUserAgent] = v[1:2:2]
	h[canonWebhookID] = v[2:3:3]
	h[canonWebhookTimestamp] = v[3:4:4]
	h[canonWebhookSignature] = v[4:5:5]
}

// The headers' canonical forms (what http.Header.Set would store), made once
// rather than per request.
var (
	canonContentType      = http.CanonicalHeaderKey(HeaderContentType)
	canonUserAgent        = http.CanonicalHeaderKey(HeaderUserAgent)
	canonWebhookID        = http.CanonicalHeaderKey(HeaderWebhookID)
	canonWebhookTimestamp = http.CanonicalHeaderKey(HeaderWebhookTimestamp)
	canonWebhookSignature = http.CanonicalHeaderKey(HeaderWebhookSignature)
)

// Envelope is the webhook request body, fields in this order:
// {"id","type","asset_id","asset_seq","timestamp","data"}.
type Envelope struct {
	// ID is the dedup id, equal to the webhook-id header.
	ID   string `json:"id"`
	Type string `json:"type"`
	// AssetID null is the null-asset stream.
	AssetID *string `json:"asset_id"`
	// AssetSeq is gapless per asset as enqueued; null for a record that did
	// not come from the relay. A receiver orders by it.
	AssetSeq *int64 `json:"asset_seq"`
	// Timestamp is the event's creation time, RFC 3339 in UTC (with
	// sub-second digits when it has them).
	Timestamp string          `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

// NewEnvelope returns the envelope of an event created at created.
func NewEnvelope(eventID, eventType string, assetID *string, assetSeq *int64, created time.Time, payload []byte) Envelope {
	return Envelope{
		ID: eventID, Type: eventType, AssetID: assetID, AssetSeq: assetSeq,
		Timestamp: created.UTC().Format(time.RFC3339Nano), Data: json.RawMessage(payload),
	}
}

// Marshal returns the body bytes that are signed and sent: exactly what
// encoding/json's Encoder with SetEscapeHTML(false) writes (the payload
// compacted, nothing HTML-escaped), built by appending. The encoder's
// reflection cost a few microseconds per webhook; the envelope's shape is
// fixed, so only its strings and the payload need JSON's rules.
func (e Envelope) Marshal() ([]byte, error) {
	n := 96 + len(e.ID) + len(e.Type) + len(e.Timestamp) + len(e.Data)
	if e.AssetID != nil {
		n += len(*e.AssetID)
	}
	b := make([]byte, 0, n)
	b = append(b, `{"id":`...)
	b = appendJSONString(b, e.ID)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, e.Type)
	b = append(b, `,"asset_id":`...)
	if e.AssetID == nil {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, *e.AssetID)
	}
	b = append(b, `,"asset_seq":`...)
	if e.AssetSeq == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, *e.AssetSeq, 10)
	}
	b = append(b, `,"timestamp":`...)
	b = appendJSONString(b, e.Timestamp)
	b = append(b, `,"data":`...)
	if e.Data == nil {
		b = append(b, "null"...)
	} else {
		// The producer's JSON, validated and compacted as the encoder does
		// with a json.RawMessage (Compact escapes nothing).
		buf := bytes.NewBuffer(b)
		if err := json.Compact(buf, e.Data); err != nil {
			return nil, fmt.Errorf("encode webhook envelope: json: error calling MarshalJSON for type json.RawMessage: %w", err)
		}
		b = buf.Bytes()
	}
	return append(b, '}'), nil
}

// appendJSONString appends s as a JSON string. Printable ASCII without '"'
// and '\\' (ids, types, timestamps) is copied as is; anything else takes
// encoding/json's rules (control characters, invalid UTF-8, U+2028/U+2029),
// without HTML escaping, as Marshal's encoder would.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			_ = enc.Encode(s) // a string always encodes
			return append(b, bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// Created parses Timestamp.
func (e Envelope) Created() (time.Time, error) {
	return time.Parse(time.RFC3339Nano, e.Timestamp)
}

// AssetKey is the asset id, "" for the null asset: with the subscription, the
// stream whose order a receiver checks.
func (e Envelope) AssetKey() string {
	if e.AssetID == nil {
		return ""
	}
	return *e.AssetID
}

// ParseEnvelope reads a webhook body. It refuses a body that is not a JSON
// object with a non-empty id and type: signed by the bridge but not its
// envelope is a bug no retry fixes.
//
// A body in exactly Marshal's shape — the six keys in order, no whitespace
// between them, ids, types, asset ids and timestamps of printable ASCII
// without escapes — is read by parseEnvelopeFast without reflection (a
// receiver checking every request of a benchmark spent most of its parse in
// encoding/json's decoder); anything else goes through encoding/json.
// FuzzParseEnvelopeFastPathIsUnmarshal holds the two to the same result.
func ParseEnvelope(body []byte) (Envelope, error) {
	e, ok := parseEnvelopeFast(body)
	if !ok {
		e = Envelope{} // nothing of the fast path's partial read stays
		if err := json.Unmarshal(body, &e); err != nil {
			return Envelope{}, fmt.Errorf("webhook body is not the envelope: %w", err)
		}
	}
	switch {
	case e.ID == "":
		return e, errors.New("webhook body has no id")
	case e.Type == "":
		return e, errors.New("webhook body has no type")
	}
	return e, nil
}

// parseEnvelopeFast reads a body in Marshal's exact shape and reports
// whether it was one; when it reports false, json.Unmarshal decides. When
// it reports true its envelope is the one json.Unmarshal gives: the keys are
// the struct's own in order, once each; the strings have nothing that
// decoding would change (no escapes, no bytes outside printable ASCII);
// asset_seq is a JSON integer that fits an int64; data is a valid JSON
// value with nothing around it, copied as json.RawMessage copies it.
func parseEnvelopeFast(body []byte) (e Envelope, ok bool) {
	// The strings are cut from one copy of everything before data: one
	// allocation, not four.
	var head string
	if i := bytes.Index(body, []byte(`,"data":`)); i >= 0 {
		head = string(body[:i])
	}
	b := head
	// asset_id and asset_seq point into one allocation.
	var vals *struct {
		asset string
		seq   int64
	}
	if b, ok = cutPrefix(b, `{"id":`); !ok {
		return e, false
	}
	if e.ID, b, ok = plainString(b); !ok {
		return e, false
	}
	if b, ok = cutPrefix(b, `,"type":`); !ok {
		return e, false
	}
	if e.Type, b, ok = plainString(b); !ok {
		return e, false
	}
	if b, ok = cutPrefix(b, `,"asset_id":`); !ok {
		return e, false
	}
	if rest, isNull := cutPrefix(b, "null"); isNull {
		b = rest
	} else {
		var asset string
		if asset, b, ok = plainString(b); !ok {
			return e, false
		}
		vals = &struct {
			asset string
			seq   int64
		}{asset: asset}
		e.AssetID = &vals.asset
	}
	if b, ok = cutPrefix(b, `,"asset_seq":`); !ok {
		return e, false
	}
	if rest, isNull := cutPrefix(b, "null"); isNull {
		b = rest
	} else {
		n := 0
		if n < len(b) && b[n] == '-' {
			n++
		}
		digits := n
		for n < len(b) && b[n] >= '0' && b[n] <= '9' {
			n++
		}
		// JSON's integers: no leading zero, at least one digit; a fraction
		// or an exponent (which int64 refuses) is left to encoding/json.
		if n == digits || (b[digits] == '0' && n > digits+1) {
			return e, false
		}
		seq, err := strconv.ParseInt(b[:n], 10, 64)
		if err != nil {
			return e, false
		}
		if vals == nil {
			vals = &struct {
				asset string
				seq   int64
			}{}
		}
		vals.seq = seq
		e.AssetSeq, b = &vals.seq, b[n:]
	}
	if b, ok = cutPrefix(b, `,"timestamp":`); !ok {
		return e, false
	}
	if e.Timestamp, b, ok = plainString(b); !ok {
		return e, false
	}
	if b != "" {
		return e, false
	}
	rest := body[len(head)+len(`,"data":`):]
	if len(rest) < 2 || rest[len(rest)-1] != '}' {
		return e, false
	}
	data := rest[:len(rest)-1]
	if isJSONSpace(data[0]) || isJSONSpace(data[len(data)-1]) || !json.Valid(data) {
		return e, false
	}
	e.Data = append(json.RawMessage(nil), data...)
	return e, true
}

func cutPrefix(b, prefix string) (string, bool) {
	if len(b) < len(prefix) || b[:len(prefix)] != prefix {
		return b, false
	}
	return b[len(prefix):], true
}

// plainString reads a JSON string of printable ASCII without '"' or '\\'
// at the start of b: one that decodes to its own bytes.
func plainString(b string) (string, string, bool) {
	if len(b) == 0 || b[0] != '"' {
		return "", b, false
	}
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return b[1:i], b[i+1:], true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return "", b, false
		}
	}
	return "", b, false
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
