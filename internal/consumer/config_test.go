package consumer

import (
	"os"
	"testing"

	"github.com/outboxbridge/bridge/internal/config"
)

// TestDocumentedDefaultsAreTheEnvDefaults: every default this package's
// Config documents for an environment-backed field is that variable's
// envDefault, and withDefaults applies exactly those.
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
	got, want := Config{}.withDefaults(), ConfigFromEnv(config.Defaults().Consumer)
	if got.Group != want.Group || got.DedupWindow != want.DedupWindow || got.MaxPollRecords != want.MaxPollRecords ||
		got.SessionTimeout != want.SessionTimeout || got.RebalanceTimeout != want.RebalanceTimeout || got.GroupProtocol != want.GroupProtocol {
		t.Errorf("withDefaults %+v, environment defaults %+v", got, want)
	}
}
