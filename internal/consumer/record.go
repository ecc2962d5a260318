package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
)

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

// parse reads r into ev with contract.Decode. A record that cannot become a
// delivery gets a badReason instead (and only its identity fields are
// meaningful). The error is one to wait out and parse again (the schema
// registry could not answer): nothing is wrong with the record.
func parse(ctx context.Context, r *kgo.Record, values contract.ValueDecoder) (*event, error) {
	m, err := contract.DecodeWith(ctx, r, values)
	ev := &event{rec: r, createdAt: m.CreatedAt, dedupID: m.DedupID, traceparent: m.Traceparent, tracestate: m.Tracestate}
	var de *contract.DecodeError
	if errors.As(err, &de) {
		ev.badReason = de.Reason
		return ev, nil
	}
	if err != nil {
		return nil, err
	}
	ev.eventType, ev.assetID, ev.assetSeq, ev.payload = m.EventType, m.AssetID, m.AssetSeq, string(m.Payload)
	return ev, nil
}
