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
func SetWebhookHeaders(h http.Header, webhookID string, timestamp int64, signature, userAgent string) {
	h[canonContentType] = []string{ContentTypeJSON}
	h[canonUserAgent] = []string{userAgent}
	h[canonWebhookID] = []string{webhookID}
	h[canonWebhookTimestamp] = []string{strconv.FormatInt(timestamp, 10)}
	h[canonWebhookSignature] = []string{signature}
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
func ParseEnvelope(body []byte) (Envelope, error) {
	var e Envelope
	if err := json.Unmarshal(body, &e); err != nil {
		return Envelope{}, fmt.Errorf("webhook body is not the envelope: %w", err)
	}
	switch {
	case e.ID == "":
		return e, errors.New("webhook body has no id")
	case e.Type == "":
		return e, errors.New("webhook body has no type")
	}
	return e, nil
}
