package consumer

import (
	"testing"

	"github.com/outboxbridge/bridge/internal/testkit"
)

// TestDocumentedDefaultsAreTheEnvDefaults: every default this package's
// Config documents for an environment-backed field is that variable's
// envDefault, and withDefaults applies exactly those.
func TestDocumentedDefaultsAreTheEnvDefaults(t *testing.T) {
	t.Parallel()
	testkit.DocumentedDefaults(t, "config.go", Config{}.withDefaults(), envDefaults)
}
