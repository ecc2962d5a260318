package relay

import "github.com/outboxbridge/bridge/internal/config"

// ConfigFromEnv maps the RELAY_* environment (config.Relay) to a Config;
// the caller sets Logger, TracerProvider and Metrics.
func ConfigFromEnv(c config.Relay) Config {
	return Config{
		MaxAttempts:     c.MaxAttempts,
		BackoffBase:     c.BackoffBase,
		BackoffMax:      c.BackoffMax,
		BatchSize:       c.BatchSize,
		BatchBytes:      c.BatchBytes,
		PollInterval:    c.PollInterval,
		LeaseTimeout:    c.LeaseTimeout,
		ProduceTimeout:  c.ProduceTimeout,
		Retention:       c.Retention,
		MaxMessageBytes: c.MaxMessageBytes,
	}
}
