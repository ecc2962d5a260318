package contract

import (
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// CloudEvents binary mode (RELAY_CLOUDEVENTS=binary): the CloudEvents Kafka
// protocol binding's ce_* headers on every record, so Knative, Dapr and
// other CloudEvents consumers read the bridge's records natively. The value
// stays the payload (binary mode: the data is the record value, its
// datacontenttype the content-type header the record already carries), so a
// consumer that ignores CloudEvents sees the same record as before.
const (
	HeaderCESpecVersion = "ce_specversion"
	HeaderCEID          = "ce_id"
	HeaderCESource      = "ce_source"
	HeaderCEType        = "ce_type"
	HeaderCETime        = "ce_time"
	HeaderCESubject     = "ce_subject"
)

// CloudEventsSpecVersion is the ce_specversion the records carry.
const CloudEventsSpecVersion = "1.0"

// CloudEventsPrefix starts every CloudEvents attribute header. With
// CloudEvents on, a row's own header with this prefix is dropped: a
// consumer reading "the" ce_id must get the bridge's.
const CloudEventsPrefix = "ce_"

// CloudEvents configures the ce_* headers of a record.
type CloudEvents struct {
	// Source is ce_source (RELAY_CLOUDEVENTS_SOURCE), a URI-reference
	// naming the producer, e.g. /outbox-bridge or urn:example:catalog.
	Source string
}

// cloudEventsHeaders are ev's ce_* headers: ce_id is the dedup id (the
// same on every copy, as CloudEvents asks of a duplicate), ce_type the
// event type, ce_time the row's creation, ce_subject the asset (absent for
// the null asset).
func cloudEventsHeaders(ev Event, ce CloudEvents) []kgo.RecordHeader {
	hs := []kgo.RecordHeader{
		{Key: HeaderCESpecVersion, Value: []byte(CloudEventsSpecVersion)},
		{Key: HeaderCEID, Value: []byte(ev.DedupID)},
		{Key: HeaderCESource, Value: []byte(ce.Source)},
		{Key: HeaderCEType, Value: []byte(ev.EventType)},
	}
	if !ev.CreatedAt.IsZero() {
		hs = append(hs, kgo.RecordHeader{Key: HeaderCETime, Value: []byte(ev.CreatedAt.UTC().Format(time.RFC3339Nano))})
	}
	if ev.AssetID != nil {
		hs = append(hs, kgo.RecordHeader{Key: HeaderCESubject, Value: []byte(*ev.AssetID)})
	}
	return hs
}

func isCloudEventsHeader(k string) bool { return strings.HasPrefix(k, CloudEventsPrefix) }
