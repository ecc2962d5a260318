package cli

import (
	"github.com/spf13/cobra"
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
			return runStages(cmd.Context(), serviceAll, allStages...)
		},
	}
}
