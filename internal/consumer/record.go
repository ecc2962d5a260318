package consumer

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Header names of the Kafka record contract (PRODUCT.md "Kafka record") and
// of the dead-letter records this package writes.
const (
	HeaderDedupID     = "dedup-id"
	HeaderTraceID     = "trace-id"
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
	HeaderEventType   = "event-type"
	HeaderAssetSeq    = "asset-seq"
	HeaderContentType = "content-type"

	HeaderDLQReason    = "dlq-reason"
	HeaderDLQTopic     = "dlq-topic"
	HeaderDLQPartition = "dlq-partition"
	HeaderDLQOffset    = "dlq-offset"
)

// DeadLetterSuffix is appended to a topic's name to get its dead-letter topic.
const DeadLetterSuffix = ".dlq"

// event is one polled record on its way to deliveries (or the dead-letter
// topic).
type event struct {
	rec *kgo.Record

	dedupID     string
	eventType   string
	assetID     *string // nil: the null-asset stream
	assetSeq    *int64  // nil: no asset-seq header
	payload     string
	createdAt   time.Time
	traceparent string // stored on the deliveries ("" → NULL)
	tracestate  string

	// badReason, when set, sends the record to the dead-letter topic.
	badReason string

	// Outcome, filled in while the batch is stored.
	duplicate  bool
	deliveries int
	deadDone   bool // the dead-letter produce was acknowledged
}

// parse reads r into ev. A record that cannot become a delivery gets a
// badReason instead (and only its identity fields are meaningful).
func parse(r *kgo.Record) *event {
	ev := &event{rec: r, createdAt: r.Timestamp}
	// The first occurrence of a header wins: the relay writes the bridge's
	// headers first and never lets the row's own headers shadow them.
	var dedupID, eventType, assetSeq, traceparent, tracestate string
	seen := make(map[string]bool, 8)
	for _, h := range r.Headers {
		var dst *string
		switch h.Key {
		case HeaderDedupID:
			dst = &dedupID
		case HeaderEventType:
			dst = &eventType
		case HeaderAssetSeq:
			dst = &assetSeq
		case HeaderTraceparent:
			dst = &traceparent
		case HeaderTracestate:
			dst = &tracestate
		default:
			continue
		}
		if seen[h.Key] {
			continue
		}
		seen[h.Key] = true
		if !isText(h.Value) {
			ev.dedupID = fallbackDedupID(r)
			ev.badReason = fmt.Sprintf("header %s is not UTF-8 text", h.Key)
			return ev
		}
		*dst = string(h.Value)
	}
	ev.dedupID = cmp.Or(dedupID, fallbackDedupID(r))
	ev.traceparent, ev.tracestate = traceparent, tracestate
	switch {
	case eventType == "":
		ev.badReason = "no event-type header"
		return ev
	case !isText(r.Key):
		ev.badReason = "key is not UTF-8 text"
		return ev
	case !utf8.Valid(r.Value) || !json.Valid(r.Value):
		ev.badReason = "value is not valid JSON"
		return ev
	}
	ev.eventType = eventType
	if assetSeq != "" {
		n, err := strconv.ParseInt(assetSeq, 10, 64)
		if err != nil || n < 0 {
			ev.badReason = fmt.Sprintf("asset-seq header %q is not a non-negative decimal integer", truncate(assetSeq, 40))
			return ev
		}
		ev.assetSeq = &n
	}
	if len(r.Key) > 0 {
		id := string(r.Key)
		ev.assetID = &id
	}
	ev.payload = string(r.Value)
	return ev
}

// fallbackDedupID identifies a record without a dedup-id header. It is stable
// across redeliveries of the same record, which is all the inbox needs.
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
