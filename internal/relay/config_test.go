package relay

import (
	"testing"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// TestDocumentedDefaultsAreTheEnvDefaults: every default Config documents
// for a RELAY_* field is that variable's envDefault, and WithDefaults applies
// exactly those.
func TestDocumentedDefaultsAreTheEnvDefaults(t *testing.T) {
	t.Parallel()
	testkit.DocumentedDefaults(t, "config.go")
	got, want := Config{}.WithDefaults(), ConfigFromEnv(config.Defaults().Relay)
	if got.MaxAttempts != want.MaxAttempts || got.BackoffBase != want.BackoffBase || got.BackoffMax != want.BackoffMax ||
		got.BatchSize != want.BatchSize || got.BatchBytes != want.BatchBytes || got.PollInterval != want.PollInterval ||
		got.LeaseTimeout != want.LeaseTimeout || got.ProduceTimeout != want.ProduceTimeout || got.Retention != want.Retention ||
		got.MaxMessageBytes != want.MaxMessageBytes {
		t.Errorf("WithDefaults %+v, environment defaults %+v", got, want)
	}
}
