package cli

import (
	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/consumer"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
)

func init() {
	register(newConsumeCmd)
}

func newConsumeCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "consume",
		GroupID: groupRun,
		Short:   "Turn Kafka records into webhook deliveries (consumer group, each record once)",
		Long: `consume joins the Kafka consumer group CONSUMER_GROUP on CONSUMER_TOPICS and
turns each record into one delivery per matching enabled subscription. Each
polled batch is one PostgreSQL transaction that records the records' dedup ids
in the consumer inbox (a redelivered or duplicated record adds nothing); Kafka
offsets are committed only after it. Records that cannot be processed go to
"<topic>.dlq" with a dlq-reason header. SIGTERM finishes and commits the batch
in flight, then leaves the group.

Needs DATABASE_URL (migrated schema), KAFKA_BROKERS and CONSUMER_TOPICS.`,
		Example: `  DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable \
  KAFKA_BROKERS=127.0.0.1:9092 CONSUMER_TOPICS=assets,orders bridge consume

  # every topic starting with "assets.", in group "bridge-eu"
  CONSUMER_TOPICS='~^assets\.' CONSUMER_GROUP=bridge-eu bridge consume`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(config.Needs{Database: true, Kafka: true, Topics: true})
			if err != nil {
				return err
			}
			if err := consumer.ValidateTopics(cfg.Consumer.Topics); err != nil {
				return err
			}
			rt, err := startRuntime(cmd.Context(), cfg, "outbox-bridge-consume")
			if err != nil {
				return err
			}
			defer rt.Close()
			c, err := newConsumer(cfg, rt)
			if err != nil {
				return err
			}
			return c.Run(cmd.Context())
		},
	}
}

// newConsumer builds the consumer from CONSUMER_* and the shared runtime
// (logger, pool, tracer provider); `bridge run` uses it too.
func newConsumer(cfg *config.Config, rt *runtime) (*consumer.Consumer, error) {
	kopts, err := kafkaclient.Options(cfg.Kafka, rt.Logger)
	if err != nil {
		return nil, err
	}
	cc := consumer.ConfigFromEnv(cfg.Consumer)
	cc.Logger = rt.Logger
	cc.TracerProvider = rt.TracerProvider
	c, err := consumer.New(rt.Pool, kopts, cc)
	if err != nil {
		return nil, err
	}
	// Counters and group lag on /metrics (internal/metrics).
	if err := rt.ObserveConsumer(c, cc.Group); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
