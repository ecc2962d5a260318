// Package eventbounds is the longest value of each event field the bridge
// accepts, in one place. A value past its bound is refused where it enters:
// bridge.enqueue and bridge.enqueue_batch (the SQL function
// bridge.check_event_bounds, migration 00180, holds the same numbers),
// outbox.Enqueue and EnqueueBatch, and the consumer's decoding of a Kafka
// record (contract.Decode: a foreign record over a bound is dead-lettered on
// its own). It imports nothing of the bridge, so the public outbox package
// can use it without linking the Kafka client.
//
// Why bounds at all: every field below ends up in a btree index somewhere
// on its way to a webhook, and a btree entry larger than about 2,704 bytes
// (a third of an 8 kB page) is refused with SQLSTATE 54000. An asset id of
// 2,680 bytes still fits bridge.asset_counters' primary key at enqueue, but
// not deliveries_open_by_stream (subscription uuid + asset id + seq) at the
// consumer: without a bound at entry such an event is accepted, relayed and
// then refused by the consumer, far from the code that wrote it. The
// numbers are round, and each leaves the widest index that holds the field
// under half the btree limit (docs/contract.md, "Bounds"):
//
//   - asset id, 512 bytes: asset_counters_pkey, outbox_asset_seq and
//     outbox_waiting_retry (+ bigint), deliveries_open_by_stream and
//     deliveries_in_flight_by_stream (uuid + asset id [+ bigint]),
//     delivery_streams' primary key (uuid + asset key); also the Kafka key.
//   - dedup id, 512 bytes: consumer_inbox's primary key and
//     deliveries_once_per_subscription (uuid + event id). The bridge's own
//     are 36-byte UUIDs; a foreign record without one is identified by
//     "topic/partition/offset", at most 280 bytes.
//   - topic, 249 bytes: Kafka's own limit (internal/topicname).
//   - event type, 256 bytes: a subscription's filter matches it; webhook
//     header webhook-event-type.
//   - header name 256 bytes, header value 8,192 bytes, at most 64 headers:
//     they travel as Kafka record headers (the broker's default record
//     limit is 1 MB) and are not indexed, so these bound the record rather
//     than an index.
package eventbounds

import (
	"fmt"
	"sort"
)

// The bounds, in bytes of UTF-8.
const (
	MaxAssetID     = 512
	MaxDedupID     = 512
	MaxTopic       = 249
	MaxEventType   = 256
	MaxHeaderName  = 256
	MaxHeaderValue = 8192
	MaxHeaders     = 64
)

// Argument names, as bridge.enqueue names its parameters: the error names
// the argument the caller passed.
const (
	ArgAssetID   = "asset_id"
	ArgEventType = "event_type"
	ArgTopic     = "topic"
	ArgHeaders   = "headers"
	ArgDedupID   = "dedup_id"
)

// Error is a value past its bound.
type Error struct {
	// Arg is the argument (asset_id, event_type, topic, headers, dedup_id).
	Arg string
	// Problem says what is too long, e.g. "is 2680 bytes; at most 512 are
	// allowed".
	Problem string
}

func (e *Error) Error() string { return e.Arg + " " + e.Problem }

func tooLong(arg string, n, limit int) *Error {
	return &Error{Arg: arg, Problem: fmt.Sprintf("is %d bytes long; at most %d are allowed", n, limit)}
}

// Length checks one value of arg against limit.
func Length(arg, value string, limit int) error {
	if len(value) > limit {
		return tooLong(arg, len(value), limit)
	}
	return nil
}

// Check checks an event's fields the way bridge.check_event_bounds does,
// in the same order, with the same messages.
func Check(topic, assetID, eventType string, headers map[string]string) error {
	if err := Length(ArgTopic, topic, MaxTopic); err != nil {
		return err
	}
	if err := Length(ArgAssetID, assetID, MaxAssetID); err != nil {
		return err
	}
	if err := Length(ArgEventType, eventType, MaxEventType); err != nil {
		return err
	}
	return Headers(len(headers), func(yield func(name, value string) bool) {
		names := make([]string, 0, len(headers))
		for k := range headers {
			names = append(names, k)
		}
		sort.Strings(names) // the first offending header is the same every time
		for _, k := range names {
			if !yield(k, headers[k]) {
				return
			}
		}
	})
}

// Headers checks a set of n headers, visited by each.
func Headers(n int, each func(yield func(name, value string) bool)) error {
	if n > MaxHeaders {
		return &Error{Arg: ArgHeaders, Problem: fmt.Sprintf("has %d entries; at most %d are allowed", n, MaxHeaders)}
	}
	var err error
	each(func(name, value string) bool {
		switch {
		case len(name) > MaxHeaderName:
			err = &Error{Arg: ArgHeaders, Problem: fmt.Sprintf("has a name %d bytes long; at most %d are allowed", len(name), MaxHeaderName)}
		case len(value) > MaxHeaderValue:
			err = &Error{Arg: ArgHeaders, Problem: fmt.Sprintf("value of '%s' is %d bytes long; at most %d are allowed", name, len(value), MaxHeaderValue)}
		}
		return err == nil
	})
	return err
}
