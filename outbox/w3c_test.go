package outbox

import (
	"testing"

	"github.com/outboxbridge/bridge/internal/contract"
)

// The trace context stored with a row travels under the contract's header
// names; outbox reads them from the W3C propagator instead of importing the
// contract package (which links the Kafka client into applications).
func TestW3CKeysAreTheContractHeaders(t *testing.T) {
	t.Parallel()
	if w3cTraceparent != contract.HeaderTraceparent || w3cTracestate != contract.HeaderTracestate {
		t.Fatalf("propagator keys %q, %q; contract headers %q, %q",
			w3cTraceparent, w3cTracestate, contract.HeaderTraceparent, contract.HeaderTracestate)
	}
}
