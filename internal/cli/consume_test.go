package cli

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/outboxbridge/bridge/internal/config"
)

// Not parallel: it sets the process environment the command reads.
func TestConsumeRefusesBadTopicsWithExitTwo(t *testing.T) {
	for name, tc := range map[string]struct{ topics, want string }{
		"missing":     {"", "CONSUMER_TOPICS is required"},
		"blank":       {" , ", `CONSUMER_TOPICS=" , " has an empty item`},
		"bad pattern": {"orders,~assets.(", `CONSUMER_TOPICS="~assets.(" is not a valid regular expression`},
		"bad topic":   {"orders,bad topic", `CONSUMER_TOPICS="bad topic" is not a valid Kafka topic name: only ASCII letters`},
		"too long":    {strings.Repeat("x", 250), `is not a valid Kafka topic name: it is 250 characters long`},
		"internal":    {"~orders,__consumer_offsets", `CONSUMER_TOPICS="__consumer_offsets" is not a valid Kafka topic name`},
	} {
		t.Run(name, func(t *testing.T) {
			// Nothing listens on port 1: reaching PostgreSQL or Kafka would
			// fail with exit 1, so exit 2 proves the check came first.
			t.Setenv("DATABASE_URL", "postgres://bridge:bridge@127.0.0.1:1/bridge?sslmode=disable")
			t.Setenv("KAFKA_BROKERS", "127.0.0.1:1")
			t.Setenv("CONSUMER_TOPICS", tc.topics)
			t.Setenv("WEBHOOK_FAST_LANE", "false")
			var stdout, stderr bytes.Buffer
			if code := Execute([]string{"consume"}, &stdout, &stderr); code != ExitUsage {
				t.Fatalf("exit %d (stderr %q), want %d", code, stderr.String(), ExitUsage)
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr %q does not say %q", stderr.String(), tc.want)
			}
		})
	}
}

// With the fast lane on (the default), `bridge deliver` reads the topics;
// `bridge consume` refuses at once, naming the variable and the way back to
// the row engine, and `bridge deliver` refuses to run without the brokers
// and topics it now reads — what an installation upgraded from the row
// engine meets first.
func TestFastLaneSettingsAreCheckedBeforeConnecting(t *testing.T) {
	for name, tc := range map[string]struct{ cmd, brokers, topics, fastLane, want string }{
		"consume":                 {"consume", "127.0.0.1:1", "assets", "", "WEBHOOK_FAST_LANE=\"true\" (the default) makes `bridge deliver` read CONSUMER_TOPICS itself"},
		"consume explicitly":      {"consume", "127.0.0.1:1", "assets", "true", "or set WEBHOOK_FAST_LANE=false to keep the row engine"},
		"deliver without topics":  {"deliver", "127.0.0.1:1", "", "", "CONSUMER_TOPICS is required by `bridge deliver` with WEBHOOK_FAST_LANE (the default)"},
		"deliver without brokers": {"deliver", "", "assets", "true", "KAFKA_BROKERS is required by `bridge deliver` with WEBHOOK_FAST_LANE"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("DATABASE_URL", "postgres://bridge:bridge@127.0.0.1:1/bridge?sslmode=disable")
			t.Setenv("KAFKA_BROKERS", tc.brokers)
			t.Setenv("CONSUMER_TOPICS", tc.topics)
			// Unset for the default; t.Setenv restores the caller's value.
			t.Setenv("WEBHOOK_FAST_LANE", tc.fastLane)
			if tc.fastLane == "" {
				if err := os.Unsetenv("WEBHOOK_FAST_LANE"); err != nil {
					t.Fatal(err)
				}
			}
			t.Setenv("BRIDGE_ALLOW_PLAINTEXT_SECRETS", "true")
			var stdout, stderr bytes.Buffer
			if code := Execute([]string{tc.cmd}, &stdout, &stderr); code != ExitUsage {
				t.Fatalf("exit %d (stderr %q), want %d", code, stderr.String(), ExitUsage)
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr %q does not say %q", stderr.String(), tc.want)
			}
		})
	}
}

// config.CommandNeeds["run"], what the deployment checks hold `bridge run`
// to, is what its stages ask for together.
func TestRunNeedsAreItsStagesNeeds(t *testing.T) {
	if got, _ := needsOf(allStages); got != config.CommandNeeds["run"] {
		t.Errorf("bridge run's stages need %+v, config.CommandNeeds[\"run\"] says %+v", got, config.CommandNeeds["run"])
	}
}
