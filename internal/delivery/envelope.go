package delivery

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// envelope is the request body of the contract, fields in this order:
// {"id","type","asset_id","asset_seq","timestamp","data"}.
type envelope struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	AssetID   *string         `json:"asset_id"`
	AssetSeq  *int64          `json:"asset_seq"`
	Timestamp string          `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

// Envelope returns the webhook body for an event. timestamp is the event's
// creation time in RFC 3339 (UTC, with sub-second digits when it has them).
func Envelope(eventID, eventType string, assetID *string, assetSeq *int64, created time.Time, payload []byte) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// The payload is the producer's JSON; it must not come out with <, > and
	// & rewritten as \u003c... (the receiver's signature check is over these
	// exact bytes either way, but its logs should show what was sent).
	enc.SetEscapeHTML(false)
	err := enc.Encode(envelope{
		ID: eventID, Type: eventType, AssetID: assetID, AssetSeq: assetSeq,
		Timestamp: created.UTC().Format(time.RFC3339Nano), Data: json.RawMessage(payload),
	})
	if err != nil {
		return nil, fmt.Errorf("encode webhook envelope: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}
