package contract

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/eventbounds"
	"github.com/outboxbridge/bridge/outbox/schema"
)

// Header names of the Kafka record (docs/contract.md, "Kafka record").
const (
	HeaderDedupID     = "dedup-id"
	HeaderTraceID     = "trace-id"
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
	HeaderEventType   = "event-type"
	HeaderAssetSeq    = "asset-seq"
	HeaderContentType = "content-type"
	// HeaderCreatedAt is the row's created_at, the event's creation time:
	// what every webhook body's timestamp says, the same on every copy of
	// the event. The record's own timestamp is the produce time, which
	// differs between copies and is left to the producer: franz-go measures
	// RecordDeliveryTimeout from it, so a backlog produced with old
	// timestamps would time out as a whole.
	HeaderCreatedAt = "created-at"
)

// Header names of the dead-letter records the consumer writes: where the
// record came from and why it could not become a delivery.
const (
	HeaderDLQReason    = "dlq-reason"
	HeaderDLQTopic     = "dlq-topic"
	HeaderDLQPartition = "dlq-partition"
	HeaderDLQOffset    = "dlq-offset"
)

// Header names of the CloudEvents Kafka protocol binding, binary mode (the
// relay adds them with RELAY_CLOUDEVENTS=binary; docs/contract.md). The
// payload stays the record's value and content-type its datacontenttype, so
// a CloudEvents consumer (Knative, Dapr, the SDKs) reads the record as an
// event and everyone else sees the same record as before plus six headers.
const (
	HeaderCESpecVersion = "ce_specversion"
	HeaderCEID          = "ce_id"
	HeaderCESource      = "ce_source"
	HeaderCEType        = "ce_type"
	HeaderCETime        = "ce_time"
	HeaderCESubject     = "ce_subject"
)

// CloudEventsSpecVersion is the ce_specversion the bridge writes.
const CloudEventsSpecVersion = "1.0"

// cloudEventsReserved are the CloudEvents attribute headers: in CloudEvents
// mode a row's own headers cannot shadow them either (a row header ce_type
// would make a CloudEvents consumer see a different event type than the
// bridge's event-type).
var cloudEventsReserved = map[string]bool{
	HeaderCESpecVersion: true, HeaderCEID: true, HeaderCESource: true, HeaderCEType: true,
	HeaderCETime: true, HeaderCESubject: true,
}

// ContentTypeJSON is the content-type of every record value and webhook body.
const ContentTypeJSON = "application/json"

// DeadLetterSuffix is appended to a topic's name to get its dead-letter topic.
const DeadLetterSuffix = ".dlq"

// reserved are the bridge's own header names. A row's own headers cannot
// shadow them: a consumer reading "the" dedup-id must get the bridge's.
var reserved = map[string]bool{
	HeaderDedupID: true, HeaderTraceID: true, HeaderTraceparent: true, HeaderTracestate: true,
	HeaderEventType: true, HeaderAssetSeq: true, HeaderContentType: true, HeaderCreatedAt: true,
}

// Event is one outbox row as it goes onto Kafka.
type Event struct {
	// DedupID is the row id (canonical UUID text): every copy of the event
	// carries it, so at-least-once delivery can be deduplicated downstream.
	DedupID string
	Topic   string
	// AssetID nil is the null-asset stream.
	AssetID   *string
	AssetSeq  int64
	EventType string
	Payload   []byte
	// Headers are the row's own headers; they follow the bridge's.
	Headers map[string]string
	// TraceID (32 lowercase hex), Traceparent and Tracestate (W3C) of the
	// span the record continues; "" when the row has no trace.
	TraceID, Traceparent, Tracestate string
	// CreatedAt is when the row was committed (the event's time).
	CreatedAt time.Time
	// CloudEventsSource, when not empty, adds the CloudEvents binary-mode
	// headers with it as ce_source (RELAY_CLOUDEVENTS_SOURCE).
	CloudEventsSource string
}

// Encode returns the Kafka record of ev. The key is the asset id; the null
// asset gets an empty, non-nil key, which the murmur2 partitioner hashes like
// any other key (a nil key would be spread over partitions and lose order).
// The bridge's headers come first, then the row's own in name order (stable
// bytes for the same row), without any that would shadow the bridge's.
func Encode(ev Event) *kgo.Record {
	key := []byte{}
	if ev.AssetID != nil {
		key = []byte(*ev.AssetID)
	}
	hs := make([]kgo.RecordHeader, 0, 8+len(ev.Headers))
	hs = append(hs, kgo.RecordHeader{Key: HeaderDedupID, Value: []byte(ev.DedupID)})
	if ev.TraceID != "" {
		hs = append(hs, kgo.RecordHeader{Key: HeaderTraceID, Value: []byte(ev.TraceID)})
	}
	if ev.Traceparent != "" {
		hs = append(hs, kgo.RecordHeader{Key: HeaderTraceparent, Value: []byte(ev.Traceparent)})
	}
	if ev.Tracestate != "" {
		hs = append(hs, kgo.RecordHeader{Key: HeaderTracestate, Value: []byte(ev.Tracestate)})
	}
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderEventType, Value: []byte(ev.EventType)},
		kgo.RecordHeader{Key: HeaderAssetSeq, Value: []byte(strconv.FormatInt(ev.AssetSeq, 10))},
		kgo.RecordHeader{Key: HeaderContentType, Value: []byte(ContentTypeJSON)},
	)
	// An event without a creation time (none from the relay, which always
	// has created_at) has no created-at: a reader then falls back to the
	// record's timestamp rather than to year 1.
	if !ev.CreatedAt.IsZero() {
		hs = append(hs, kgo.RecordHeader{Key: HeaderCreatedAt, Value: []byte(formatCreatedAt(ev.CreatedAt))})
	}
	cloudEvents := ev.CloudEventsSource != ""
	if cloudEvents {
		hs = append(hs,
			kgo.RecordHeader{Key: HeaderCESpecVersion, Value: []byte(CloudEventsSpecVersion)},
			kgo.RecordHeader{Key: HeaderCEID, Value: []byte(ev.DedupID)},
			kgo.RecordHeader{Key: HeaderCESource, Value: []byte(ev.CloudEventsSource)},
			kgo.RecordHeader{Key: HeaderCEType, Value: []byte(ev.EventType)},
			kgo.RecordHeader{Key: HeaderCETime, Value: []byte(formatCreatedAt(ev.CreatedAt))},
		)
		// The null asset has no subject (an empty ce_subject is invalid).
		if ev.AssetID != nil && *ev.AssetID != "" {
			hs = append(hs, kgo.RecordHeader{Key: HeaderCESubject, Value: []byte(*ev.AssetID)})
		}
	}
	keys := make([]string, 0, len(ev.Headers))
	for k := range ev.Headers {
		if !reserved[k] && !(cloudEvents && cloudEventsReserved[k]) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(ev.Headers[k])})
	}
	return &kgo.Record{Topic: ev.Topic, Key: key, Value: ev.Payload, Headers: hs}
}

// Message is a Kafka record read back as an event.
type Message struct {
	// DedupID is the dedup-id header, or for a record without one
	// "topic/partition/offset", which is stable across redeliveries of the
	// same record (all an inbox needs).
	DedupID   string
	EventType string
	// AssetID nil: the null-asset stream (an empty key).
	AssetID *string
	// AssetSeq nil: the record has no asset-seq header (not produced by the
	// relay).
	AssetSeq *int64
	Payload  []byte
	// CreatedAt is the event's creation time: the created-at header, or
	// for a record without a valid one the record's timestamp.
	CreatedAt   time.Time
	Traceparent string
	Tracestate  string
}

// DecodeError says why a record cannot become a delivery. Its text is what
// the dead-letter record's dlq-reason header carries.
type DecodeError struct{ Reason string }

func (e *DecodeError) Error() string { return e.Reason }

// Decode reads r. On a *DecodeError the Message still has its DedupID, so the
// record can be dead-lettered under a stable identity.
//
// The first occurrence of a header wins: Encode writes the bridge's headers
// first and never lets the row's own shadow them. Every field that is stored
// in a PostgreSQL text column must be valid UTF-8 without NUL bytes, and the
// value valid JSON (it becomes a jsonb payload).
func Decode(r *kgo.Record) (Message, error) {
	return DecodeWith(context.Background(), r, nil)
}

// ValueDecoder turns a record value into its JSON payload: a
// *schema.Registry, which reads an Avro-governed topic's binary back to JSON.
type ValueDecoder interface {
	DecodeValue(ctx context.Context, value []byte) ([]byte, error)
}

// DecodeWith is Decode with values turning the record value into the JSON
// payload. With values nil a framed value loses its framing only, which
// suits JSON Schema subjects; an Avro-framed value then is not JSON and the
// record is dead-lettered, as it is when values cannot decode it (the
// registry does not know the id, or the binary does not fit its schema).
// A registry that cannot answer is not the record's fault: the error then
// wraps schema.ErrUnavailable and is not a *DecodeError, and the caller
// waits and decodes the record again.
func DecodeWith(ctx context.Context, r *kgo.Record, values ValueDecoder) (Message, error) {
	m := Message{CreatedAt: r.Timestamp}
	var dedupID, eventType, assetSeq string
	seen := make(map[string]bool, 8)
	for _, h := range r.Headers {
		var dst *string
		switch h.Key {
		case HeaderCreatedAt:
			// The event's time is informational (the envelope's
			// timestamp; nothing orders or deduplicates by it), so a
			// created-at that does not parse is no reason to dead-letter
			// an otherwise good record: the record's timestamp stands in,
			// as for a record produced without the header.
			if !seen[h.Key] {
				seen[h.Key] = true
				if t, err := time.Parse(time.RFC3339Nano, string(h.Value)); err == nil {
					m.CreatedAt = t
				}
			}
			continue
		case HeaderDedupID:
			dst = &dedupID
		case HeaderEventType:
			dst = &eventType
		case HeaderAssetSeq:
			dst = &assetSeq
		case HeaderTraceparent:
			dst = &m.Traceparent
		case HeaderTracestate:
			dst = &m.Tracestate
		default:
			continue
		}
		if seen[h.Key] {
			continue
		}
		seen[h.Key] = true
		if !isText(h.Value) {
			m.DedupID = fallbackDedupID(r)
			m.Traceparent, m.Tracestate = "", ""
			return m, &DecodeError{fmt.Sprintf("header %s is not UTF-8 text", h.Key)}
		}
		*dst = string(h.Value)
	}
	// A dedup id past its bound cannot be the record's identity (it would
	// not fit consumer_inbox's key): the record is dead-lettered under
	// "topic/partition/offset".
	if len(dedupID) > eventbounds.MaxDedupID {
		m.DedupID = fallbackDedupID(r)
		m.Traceparent, m.Tracestate = "", ""
		return m, &DecodeError{fmt.Sprintf("header %s is %d bytes long; at most %d are allowed", HeaderDedupID, len(dedupID), eventbounds.MaxDedupID)}
	}
	// The dedup id is the webhook-id header of every request: a control
	// character there makes every attempt fail before it is sent, for the
	// whole retry schedule.
	if strings.IndexFunc(dedupID, unicode.IsControl) >= 0 {
		m.DedupID = fallbackDedupID(r)
		m.Traceparent, m.Tracestate = "", ""
		return m, &DecodeError{fmt.Sprintf("header %s %s contains a control character", HeaderDedupID, strconv.QuoteToASCII(truncate(dedupID, 40)))}
	}
	m.DedupID = cmp.Or(dedupID, fallbackDedupID(r))
	// A governed topic's value carries the Confluent framing (magic byte 0,
	// schema id) before the JSON or the Avro binary: the delivery is the
	// JSON, as for any topic (docs/contract.md, "Schema-governed topics").
	// JSON never starts with the byte 0, so an ungoverned value is never
	// mistaken for a framed one.
	value := r.Value
	if id, p, ok := schema.Unframe(value); ok {
		value = p
		if values != nil {
			js, err := values.DecodeValue(ctx, r.Value)
			if errors.Is(err, schema.ErrUnavailable) {
				return m, err
			}
			if err != nil {
				return m, &DecodeError{fmt.Sprintf("value of schema id %d cannot be decoded: %v", id, err)}
			}
			value = js
		}
	}
	switch {
	case eventType == "":
		return m, &DecodeError{"no " + HeaderEventType + " header"}
	case len(eventType) > eventbounds.MaxEventType:
		return m, &DecodeError{fmt.Sprintf("header %s is %d bytes long; at most %d are allowed", HeaderEventType, len(eventType), eventbounds.MaxEventType)}
	case len(r.Key) > eventbounds.MaxAssetID:
		return m, &DecodeError{fmt.Sprintf("key (the asset id) is %d bytes long; at most %d are allowed", len(r.Key), eventbounds.MaxAssetID)}
	case !isText(r.Key):
		return m, &DecodeError{"key is not UTF-8 text"}
	case !utf8.Valid(value) || !json.Valid(value):
		return m, &DecodeError{"value is not valid JSON"}
	}
	m.EventType = eventType
	if assetSeq != "" {
		n, err := strconv.ParseInt(assetSeq, 10, 64)
		if err != nil || n < 0 {
			return m, &DecodeError{fmt.Sprintf("%s header %q is not a non-negative decimal integer", HeaderAssetSeq, truncate(assetSeq, 40))}
		}
		m.AssetSeq = &n
	}
	if len(r.Key) > 0 {
		id := string(r.Key)
		m.AssetID = &id
	}
	m.Payload = value
	return m, nil
}

// formatCreatedAt is the text of a creation time on the record (created-at,
// ce_time): RFC 3339 in UTC with the fractional seconds it has (PostgreSQL
// keeps microseconds), so it reads back to the same instant.
func formatCreatedAt(t time.Time) string {
	return t.UTC().Format(time.RFC3339Nano)
}

func fallbackDedupID(r *kgo.Record) string {
	return fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)
}

// isText reports whether b can be stored in a PostgreSQL text column: valid
// UTF-8 without NUL bytes.
func isText(b []byte) bool {
	return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
