package delivery

import (
	"testing"

	"go.uber.org/goleak"
)

// Every Deliverer a test starts must be gone when it ends: workers, the
// LISTEN loop, the reclaim loop, idle HTTP connections.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
