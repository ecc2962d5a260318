package relay

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxbridge/bridge/outbox/schema"
)

// failureClass says what a produce failure means for the row (docs/failure-modes.md §4:
// an outage must never turn good events into FAILED ones, and a poison row
// must not be retried forever).
type failureClass int

const (
	// retriable: a transient failure; charge the row an attempt and retry it
	// after its backoff — unless the whole broker turns out to be unreachable,
	// in which case nothing is charged (an outage is not the row's fault).
	retriable failureClass = iota
	// suspect: the broker rejected the record's whole batch with an error
	// retrying cannot fix (MESSAGE_TOO_LARGE and friends). Innocent
	// neighbours in the same batch see the same error, so the row is re-sent
	// alone before it is judged.
	suspect
	// poison: retrying cannot fix it and it is this row's own fault (invalid
	// topic, authorization refused, a record over the client's limit): park
	// it at once.
	poison
)

func (c failureClass) String() string {
	switch c {
	case suspect:
		return "suspect"
	case poison:
		return "poison"
	default:
		return "retriable"
	}
}

// classify maps a produce error to its class.
func classify(err error) failureClass {
	switch {
	case errors.Is(err, kerr.MessageTooLarge),
		errors.Is(err, kerr.RecordListTooLarge),
		errors.Is(err, kerr.InvalidRecord),
		errors.Is(err, kerr.PolicyViolation),
		errors.Is(err, kerr.CorruptMessage):
		return suspect
	case errors.Is(err, schema.ErrViolation):
		// The payload does not match its governed topic's schema: no
		// retry changes the stored payload (docs/contract.md,
		// "Schema-governed topics").
		return poison
	case errors.Is(err, kerr.InvalidTopicException),
		errors.Is(err, kerr.TopicAuthorizationFailed),
		errors.Is(err, kerr.ClusterAuthorizationFailed),
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed),
		errors.Is(err, kerr.InvalidRequiredAcks),
		errors.Is(err, kerr.UnsupportedForMessageFormat):
		return poison
	}
	var ke *kerr.Error
	if errors.As(err, &ke) && !ke.Retriable {
		// Any other non-retriable broker answer: be conservative and re-send
		// alone first; a second non-retriable answer parks the row.
		return suspect
	}
	return retriable
}
func allRetriable(results []sendResult, idx []int) bool {
	for _, i := range idx {
		if classify(results[i].err) != retriable {
			return false
		}
	}
	return true
}
