package relay

import (
	"testing"

	"github.com/outboxbridge/bridge/internal/testkit"
)

// TestDocumentedDefaultsAreTheEnvDefaults: every default Config documents
// for a RELAY_* field is that variable's envDefault, and WithDefaults applies
// exactly those.
func TestDocumentedDefaultsAreTheEnvDefaults(t *testing.T) {
	t.Parallel()
	testkit.DocumentedDefaults(t, "config.go", Config{}.WithDefaults(), envDefaults)
}
