package delivery

import (
	"testing"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// TestDocumentedDefaultsAreTheEnvDefaults: every default this package's
// Config documents for a WEBHOOK_* field is that variable's envDefault, and
// withDefaults applies exactly those.
func TestDocumentedDefaultsAreTheEnvDefaults(t *testing.T) {
	t.Parallel()
	testkit.DocumentedDefaults(t, "config.go", Config{}.withDefaults(), envDefaults)
}

// TestBreakerAfterZeroTurnsTheBreakerOff: WEBHOOK_BREAKER_AFTER=0 is "never",
// not "the default": the Config the deliverer gets has no breaker.
func TestBreakerAfterZeroTurnsTheBreakerOff(t *testing.T) {
	t.Parallel()
	env := config.Defaults().Webhook
	env.BreakerAfter = 0
	cfg, err := ConfigFromEnv(env)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.withDefaults().BreakerAfter; got > 0 {
		t.Fatalf("WEBHOOK_BREAKER_AFTER=0: BreakerAfter = %d after defaults, want ≤ 0 (never)", got)
	}
	if got := envDefaults.withDefaults().BreakerAfter; got != 10 {
		t.Fatalf("default BreakerAfter = %d, want 10", got)
	}
}
