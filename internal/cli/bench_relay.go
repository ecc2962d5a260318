package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
	"github.com/outboxbridge/bridge/internal/relay"
)

func init() { registerBench(newBenchRelayCmd) }

func newBenchRelayCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "relay [--events N] [--assets K] [--payload-bytes B]",
		Short: "Relay drain rate, commit→ack latency and peak heap, next to the machine's ceilings",
		Long: `bench relay creates a scratch database next to DATABASE_URL's (it needs
CREATEDB; dropped afterwards) and a fresh topic on KAFKA_BROKERS, then reports:

  - the ceilings, measured in the same run with the same batch size: the
    relay's own claim+mark statements alone (PostgreSQL rows/s) and the same
    franz-go producer alone (Kafka records/s);
  - the drain rate of an N-event backlog over K assets (events/s), and the
    peak Go heap while draining it (bounded by RELAY_BATCH_SIZE, not by N);
  - p50/p99 commit→ack latency at a fixed offered rate (one event per
    committed transaction).

RELAY_* settings apply (RELAY_BATCH_SIZE in particular).`,
		Example: `  KAFKA_BROKERS=127.0.0.1:9092 DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable \
  bridge bench relay --events 200000 --assets 1000 --payload-bytes 300
  bridge bench relay --events 1000000 --rate 1000 -o json`,
		Args: cobra.NoArgs,
	}
	out := addOutputFlag(c)
	events := c.Flags().Int("events", 100000, "backlog to drain")
	assets := c.Flags().Int("assets", 1000, "assets the events are keyed over")
	payloadBytes := c.Flags().Int("payload-bytes", 300, "payload size in bytes")
	partitions := c.Flags().Int32("partitions", 6, "partitions of the bench topic")
	rate := c.Flags().Int("rate", 500, "offered rate for the latency run (events/s)")
	duration := c.Flags().Duration("rate-duration", 10*time.Second, "length of the latency run")
	replicas := c.Flags().Int("replicas", 1, "relay replicas in this process")
	conns := c.Flags().Int32("db-conns", 10, "PostgreSQL pool size")
	c.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkOutput(*out); err != nil {
			return err
		}
		if *events < 1 || *assets < 1 || *payloadBytes < 2 || *partitions < 1 || *rate < 1 || *duration <= 0 || *replicas < 1 {
			return UsageErrorf("--events, --assets, --partitions, --rate, --replicas must be at least 1, --payload-bytes at least 2, --rate-duration positive")
		}
		cfg, err := loadConfig(config.Needs{Database: true, Kafka: true})
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		pool, drop, err := scratchDatabase(ctx, cfg, *conns)
		if err != nil {
			return err
		}
		defer func() { pool.Close(); drop() }()
		kopts, err := kafkaclient.Options(cfg.Kafka, nil)
		if err != nil {
			return err
		}
		rc := relay.ConfigFromEnv(cfg.Relay)
		rc.Logger = newLogger(cfg)
		progress := func(s string) { fmt.Fprintln(cmd.ErrOrStderr(), "bench relay: "+s) }
		res, err := relay.Bench(ctx, pool, kopts, rc, relay.BenchOptions{
			Events: *events, Assets: *assets, PayloadBytes: *payloadBytes, Partitions: *partitions,
			Rate: *rate, RateDuration: *duration, Replicas: *replicas,
		}, progress)
		if err != nil {
			return err
		}
		if *out == "json" {
			if err := printJSON(cmd.OutOrStdout(), res); err != nil {
				return err
			}
		} else if err := printBenchRelay(cmd, res); err != nil {
			return err
		}
		if res.OrderViolations > 0 {
			return fmt.Errorf("%d keys were relayed out of order", res.OrderViolations)
		}
		return nil
	}
	return c
}

func printBenchRelay(cmd *cobra.Command, res *relay.BenchResult) error {
	{
		rows := [][]string{
			{"backlog", fmt.Sprintf("%d events over %d assets, %d-byte payloads (filled in %.1fs)", res.Events, res.Assets, res.PayloadBytes, res.FillSeconds)},
			{"relay drain", fmt.Sprintf("%.0f events/s (%.1fs, %d replica(s), batch %d)", res.DrainRate, res.DrainSeconds, res.Replicas, res.BatchSize)},
			{"ceiling: PostgreSQL claim+mark", fmt.Sprintf("%.0f rows/s", res.CeilingClaimMark)},
			{"ceiling: Kafka produce", fmt.Sprintf("%.0f records/s", res.CeilingProduce)},
			{"relay / lower ceiling", fmt.Sprintf("%.0f%%", 100*res.DrainRate/min(res.CeilingClaimMark, res.CeilingProduce))},
			{"commit→ack latency", fmt.Sprintf("p50 %.1f ms, p99 %.1f ms at %d events/s offered (%d events)", res.LatencyP50Ms, res.LatencyP99Ms, res.LatencyOffered, res.LatencyEvents)},
			{"per-key order (read back)", fmt.Sprintf("%d records verified, %d keys out of order", res.Verified, res.OrderViolations)},
			{"peak heap while draining", fmt.Sprintf("%.1f MiB (baseline %.1f MiB)", res.PeakHeapMiB, res.BaselineHeapMiB)},
		}
		return printTable(cmd.OutOrStdout(), []string{"MEASURE", "RESULT"}, rows)
	}
}
