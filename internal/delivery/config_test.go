package delivery

import (
	"slices"
	"testing"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// TestDocumentedDefaultsAreTheEnvDefaults: every default this package's
// Config documents for a WEBHOOK_* field is that variable's envDefault, and
// withDefaults applies exactly those.
func TestDocumentedDefaultsAreTheEnvDefaults(t *testing.T) {
	t.Parallel()
	testkit.DocumentedDefaults(t, "config.go")
	want, err := ConfigFromEnv(config.Defaults().Webhook)
	if err != nil {
		t.Fatal(err)
	}
	got := Config{}.withDefaults()
	if !slices.Equal(got.RetrySchedule, want.RetrySchedule) || got.DisableAfter != want.DisableAfter || got.Timeout != want.Timeout ||
		got.Lease != want.Lease || got.Workers != want.Workers || got.MaxInFlightPerSubscription != want.MaxInFlightPerSubscription ||
		got.PollInterval != want.PollInterval || got.ClaimLoops != want.ClaimLoops || got.ClaimBytes != want.ClaimBytes || got.ShutdownGrace != want.ShutdownGrace || got.Retention != want.Retention {
		t.Errorf("withDefaults %+v, environment defaults %+v", got, want)
	}
}
