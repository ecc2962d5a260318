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
	h.Set(HeaderContentType, ContentTypeJSON)
	h.Set(HeaderUserAgent, userAgent)
	h.Set(HeaderWebhookID, webhookID)
	h.Set(HeaderWebhookTimestamp, strconv.FormatInt(timestamp, 10))
	h.Set(HeaderWebhookSignature, signature)
}

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

// Marshal returns the body bytes that are signed and sent.
func (e Envelope) Marshal() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// The payload is the producer's JSON; it must not come out with <, > and
	// & rewritten as \u003c... (the receiver's signature check is over these
	// exact bytes either way, but its logs should show what was sent).
	enc.SetEscapeHTML(false)
	if err := enc.Encode(e); err != nil {
		return nil, fmt.Errorf("encode webhook envelope: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
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
