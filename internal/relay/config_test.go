package relay

import (
	"os"
	"testing"

	"github.com/outboxbridge/bridge/internal/config"
)

// TestDocumentedDefaultsAreTheEnvDefaults: every default Config documents
// for a RELAY_* field is that variable's envDefault, and WithDefaults applies
// exactly those.
func TestDocumentedDefaultsAreTheEnvDefaults(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("config.go")
	if err != nil {
		t.Fatal(err)
	}
	bad, err := config.DocumentedDefaultMismatches("config.go", string(src))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Error(b)
	}
	got, want := Config{}.WithDefaults(), ConfigFromEnv(config.Defaults().Relay)
	if got.MaxAttempts != want.MaxAttempts || got.BackoffBase != want.BackoffBase || got.BackoffMax != want.BackoffMax ||
		got.BatchSize != want.BatchSize || got.BatchBytes != want.BatchBytes || got.PollInterval != want.PollInterval ||
		got.LeaseTimeout != want.LeaseTimeout || got.ProduceTimeout != want.ProduceTimeout || got.Retention != want.Retention ||
		got.MaxMessageBytes != want.MaxMessageBytes {
		t.Errorf("WithDefaults %+v, environment defaults %+v", got, want)
	}
}
