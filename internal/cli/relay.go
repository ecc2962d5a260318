package cli

import (
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
	"github.com/outboxbridge/bridge/internal/relay"
)

func init() { register(newRelayCmd) }

// relayConfig maps the RELAY_* settings onto the relay's Config.
func relayConfig(cfg *config.Config) relay.Config {
	return relay.Config{
		MaxAttempts:     cfg.Relay.MaxAttempts,
		BackoffBase:     cfg.Relay.BackoffBase,
		BackoffMax:      cfg.Relay.BackoffMax,
		BatchSize:       cfg.Relay.BatchSize,
		PollInterval:    cfg.Relay.PollInterval,
		LeaseTimeout:    cfg.Relay.LeaseTimeout,
		ProduceTimeout:  cfg.Relay.ProduceTimeout,
		Retention:       cfg.Relay.Retention,
		MaxMessageBytes: cfg.Relay.MaxMessageBytes,
	}
}

// newProducer builds the relay's Kafka client.
func newProducer(cfg *config.Config, rc relay.Config) (*kgo.Client, error) {
	opts, err := kafkaclient.Options(cfg.Kafka, nil)
	if err != nil {
		return nil, err
	}
	return kgo.NewClient(append(opts, relay.ProducerOptions(rc)...)...)
}

// newRelay builds the relay and its producer on the shared runtime; `bridge
// run` uses it too. The returned func closes the producer.
func newRelay(cfg *config.Config, rt *runtime) (*relay.Relay, func(), error) {
	rc := relayConfig(cfg)
	rc.Logger = rt.Logger
	rc.TracerProvider = rt.TracerProvider
	rc.Metrics = rt.RelayMetrics
	client, err := newProducer(cfg, rc)
	if err != nil {
		return nil, nil, err
	}
	return relay.New(rt.Pool, client, rc), client.Close, nil
}

func newRelayCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "relay",
		GroupID: groupRun,
		Short:   "Relay committed outbox rows to Kafka, keyed by asset, in order",
		Long: `Claims NEW rows of bridge.outbox in seq order and produces them to Kafka
(key = asset id, Java-compatible murmur2, idempotent, acks=all), marking them
SENT with partition and offset after the broker acknowledged them. Any number of
replicas may run: assets are spread over 64 leased lanes, so one asset is only
ever produced by one replica. SIGTERM drains in-flight acks and exits 0.`,
		Example: `  DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable \
  KAFKA_BROKERS=127.0.0.1:9092 bridge relay`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(config.Needs{Database: true, Kafka: true})
			if err != nil {
				return err
			}
			rt, err := startRuntime(cmd.Context(), cfg, serviceRelay)
			if err != nil {
				return err
			}
			defer rt.Close()
			r, closeRelay, err := newRelay(cfg, rt)
			if err != nil {
				return err
			}
			defer closeRelay()
			return r.Run(cmd.Context())
		},
	}
}
