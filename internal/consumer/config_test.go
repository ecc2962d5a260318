package consumer

import (
	"testing"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// TestDocumentedDefaultsAreTheEnvDefaults: every default this package's
// Config documents for an environment-backed field is that variable's
// envDefault, and withDefaults applies exactly those.
func TestDocumentedDefaultsAreTheEnvDefaults(t *testing.T) {
	t.Parallel()
	testkit.DocumentedDefaults(t, "config.go")
	got, want := Config{}.withDefaults(), ConfigFromEnv(config.Defaults().Consumer)
	if got.Group != want.Group || got.DedupWindow != want.DedupWindow || got.MaxPollRecords != want.MaxPollRecords ||
		got.SessionTimeout != want.SessionTimeout || got.RebalanceTimeout != want.RebalanceTimeout || got.GroupProtocol != want.GroupProtocol {
		t.Errorf("withDefaults %+v, environment defaults %+v", got, want)
	}
}
