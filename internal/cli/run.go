package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/consumer"
)

func init() { register(newRunCmd) }

func newRunCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "run",
		GroupID: groupRun,
		Short:   "Run relay, consume and deliver in one process",
		Long: `run is relay + consume + deliver in one process, sharing one database pool,
one tracer provider and one ops server (HTTP_ADDR). Each part keeps its own
guarantees and its own graceful shutdown: SIGTERM drains all three. If one part
fails, the others are stopped and run exits 1.

Needs DATABASE_URL (migrated schema), KAFKA_BROKERS and CONSUMER_TOPICS.`,
		Example: `  DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable \
  KAFKA_BROKERS=127.0.0.1:9092 CONSUMER_TOPICS=assets bridge run`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(config.Needs{Database: true, Kafka: true, Topics: true})
			if err != nil {
				return err
			}
			if err := consumer.ValidateTopics(cfg.Consumer.Topics); err != nil {
				return err
			}
			rt, err := startRuntime(cmd.Context(), cfg, serviceAll)
			if err != nil {
				return err
			}
			defer rt.Close()
			return runAll(cmd.Context(), cfg, rt)
		},
	}
}

// runAll runs the three services until ctx ends or one of them fails.
func runAll(ctx context.Context, cfg *config.Config, rt *runtime) error {
	r, closeRelay, err := newRelay(cfg, rt)
	if err != nil {
		return err
	}
	defer closeRelay()
	c, err := newConsumer(cfg, rt)
	if err != nil {
		return err
	}
	d, err := newDeliverer(cfg, rt)
	if err != nil {
		c.Close()
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return wrap("relay", r.Run(gctx)) })
	g.Go(func() error { return wrap("consume", c.Run(gctx)) })
	g.Go(func() error { return wrap("deliver", d.Run(gctx)) })
	return g.Wait()
}

func wrap(part string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", part, err)
}
