package store

import (
	"strings"
	"testing"
)

// The log must never be a way to read a tenant's history: none of its
// statements names the payload column (what they return is checked with a
// real delivery in the delivery package's TestLogNeverReturnsPayloads).
func TestLogQueriesNeverReadThePayload(t *testing.T) {
	t.Parallel()
	for name, q := range map[string]string{"list": listDeliveriesSQL, "get": getDeliverySQL, "attempts": attemptLogSQL, "attempt key": attemptKeySQL} {
		if strings.Contains(q, "payload") {
			t.Errorf("the %s query reads the payload column", name)
		}
	}
}
