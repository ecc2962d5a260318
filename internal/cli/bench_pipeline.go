package cli

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/bench/pipelinebench"
	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
)

func init() { registerBench(newBenchPipelineCmd) }

func newBenchPipelineCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "pipeline [--rate R] [--subscriptions S] [--duration D]",
		Short: "End to end at a fixed offered rate: commit→webhook latency, each stage's rate and lag, the bridge's memory",
		Long: `bench pipeline creates a scratch database next to DATABASE_URL's (it needs
CREATEDB; dropped afterwards), a fresh topic on KAFKA_BROKERS and S
subscriptions pointing at an in-process loopback receiver that verifies
every signature and checks per-(subscription, asset) order. It starts
` + "`bridge run`" + ` (relay + consume + deliver, this binary, in a process of its own
so that its memory is measured alone), sends one warm-up event through every
stage, offers R events/s for --warm-up (10s, unmeasured: an idle pipeline
opens its connections and grows its pools in its first seconds of load),
then offers R events/s for D — from --writers writers committing
--tx-events events per transaction (single-event commits are bound by the
WAL flush) — and reports:

  - commit→webhook-received latency p50/p95/p99/max over every (event,
    subscription), and p99 minute by minute;
  - each stage's rate over the load (relay events/s, consumer delivery
    rows/s, webhooks/s) and each stage's lag when the load ended, then the
    time to drain it;
  - the latency split by stage (relay, consumer, deliverer) from the rows'
    own timestamps, for the whole load and minute by minute;
  - the bridge process's peak resident memory and its CPU (cores), and the
    whole machine's CPU (every process), minute by minute too; over the
    load, also this bench's own CPU (its writers and receiver share the
    machine with what they measure) and this machine's PostgreSQL's;
  - the rate the writers achieved: a run short of the offered rate does not
    count (exit 1, results still printed);
  - order violations, duplicates, overlapping requests, signature failures
    and rows not delivered (all must be 0);
  - what the slowest seconds were: for each second of the run, beside its
    p99, the relay's part (commit → record produced, read back from the
    topic), the garbage collections of this process and of the bridge
    (GODEBUG=gctrace=1) with both processes' memory, the processes that had
    the CPU, PostgreSQL's autovacuum workers, checkpoint writes and wait
    events, and the bridge's log lines; the ten worst seconds are printed.

The receiver keeps per (subscription, asset) only the last asset_seq and a
hash of each acknowledged webhook-id, so this process's memory does not grow
with a long run; --exact-receiver keeps the per-event maps instead.

--fast-lane (the default, as WEBHOOK_FAST_LANE is) runs the bridge with
WEBHOOK_FAST_LANE=true: ` + "`bridge run`" + ` is then relay + deliver, and deliveries go
out from the topic; only streams handed to the slow lane become rows, so the
consumer's lag and the stage split count only those (json: engine,
handed_over_to_slow_lane). --fast-lane=false runs the row engine (relay,
consume, deliver; every delivery a row).

RELAY_*, CONSUMER_* and WEBHOOK_* settings reach the bridge process as they
are set; DATABASE_URL, CONSUMER_TOPICS, CONSUMER_GROUP, HTTP_ADDR,
WEBHOOK_ALLOWED_CIDRS and WEBHOOK_FAST_LANE are the run's own.`,
		Example: `  KAFKA_BROKERS=127.0.0.1:9092 DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable \
  bridge bench pipeline
  bridge bench pipeline --rate 1000 --subscriptions 3 --duration 2m -o json
  bridge bench pipeline --partitions 12
  bridge bench pipeline --fast-lane=false`,
		Args: cobra.NoArgs,
	}
	rate := c.Flags().Int("rate", 1000, "offered events/s")
	subs := c.Flags().Int("subscriptions", 3, "subscriptions; each receives every event")
	duration := c.Flags().Duration("duration", 5*time.Minute, "how long the load is offered")
	warmUp := c.Flags().Duration("warm-up", 10*time.Second, "offer the rate this long before the measured load, unmeasured (0: measure from the first event)")
	writers := c.Flags().Int("writers", 8, "concurrent writers of the load")
	txEvents := c.Flags().Int("tx-events", 10, "events per committed transaction")
	assets := c.Flags().Int("assets", 1000, "assets the events are keyed over")
	partitions := c.Flags().Int32("partitions", 6, "partitions of the bench topic")
	drain := c.Flags().Duration("drain-timeout", 2*time.Minute, "after the load, how long to wait for every webhook")
	conns := c.Flags().Int32("db-conns", 10, "PostgreSQL pool size of the writers")
	exact := c.Flags().Bool("exact-receiver", false, "keep the per-event bookkeeping for the whole run (a map entry per webhook in the receiver, every event's commit time): this process's memory then grows with the run")
	fastLane := c.Flags().Bool("fast-lane", true, "run the bridge with WEBHOOK_FAST_LANE=true: deliveries go out from the topic, rows only for streams handed to the slow lane; false: the row engine")
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		if *rate < 1 || *subs < 1 || *duration < time.Second || *writers < 1 || *txEvents < 1 || *assets < 1 || *partitions < 1 || *drain <= 0 || *conns < 2 || *warmUp < 0 {
			return UsageErrorf("--rate, --subscriptions, --writers, --tx-events, --assets and --partitions must be at least 1, --duration at least 1s, --drain-timeout positive, --db-conns at least 2, --warm-up not negative")
		}
		cfg, err := loadConfig(config.Needs{Database: true, Kafka: true})
		if err != nil {
			return err
		}
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find this binary to run the bridge: %w", err)
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
		stderr := cmd.ErrOrStderr()
		res, err := pipelinebench.Run(ctx, pool, kopts, pipelinebench.Options{
			Rate: *rate, Subscriptions: *subs, Duration: *duration, WarmUp: *warmUp, Writers: *writers, TxEvents: *txEvents,
			Assets: *assets, Partitions: *partitions, DrainTimeout: *drain, FastLane: *fastLane, ExactReceiver: *exact,
			DatabaseURL: withDatabaseName(cfg.Database.URL, pool.Config().ConnConfig.Database),
			Bridge: func(env []string) *exec.Cmd {
				bc := exec.CommandContext(ctx, exe, "run")
				bc.Env = append(os.Environ(), env...)
				bc.Stdout, bc.Stderr = stderr, stderr
				return bc
			},
			Progress: func(s string) { fmt.Fprintln(stderr, "bench pipeline: "+s) },
		})
		if res != nil {
			if out == "json" {
				if perr := printJSON(cmd.OutOrStdout(), res); perr != nil {
					return perr
				}
			} else if perr := printBenchPipeline(cmd, res); perr != nil {
				return perr
			}
		}
		if err != nil {
			return err
		}
		if res.OrderViolations > 0 || res.Overlaps > 0 || res.SignatureFailures > 0 || res.NotDelivered > 0 {
			return fmt.Errorf("%d order violations, %d overlapping requests, %d signature failures, %d deliveries not delivered",
				res.OrderViolations, res.Overlaps, res.SignatureFailures, res.NotDelivered)
		}
		return nil
	})
	return c
}

func printBenchPipeline(cmd *cobra.Command, res *pipelinebench.Result) error {
	rows := [][]string{
		{"load", fmt.Sprintf("%d events/s offered × %d subscriptions, %.0f achieved; %d events in %.0fs after a %.0fs warm-up (%d writers, %d events/tx, %d assets, %d partitions)",
			res.OfferedRate, res.Subscriptions, res.AchievedRate, res.Events, res.LoadSeconds, res.WarmUpSeconds, res.Writers, res.TxEvents, res.Assets, res.Partitions)},
		{"commit→webhook latency", fmt.Sprintf("p50 %.1f ms, p95 %.1f ms, p99 %.1f ms, max %.1f ms", res.LatencyP50Ms, res.LatencyP95Ms, res.LatencyP99Ms, res.LatencyMaxMs)},
		{"stage rates over the load", fmt.Sprintf("relay %.0f events/s, consumer %.0f deliveries/s, webhooks %.0f/s", res.RelayPerSecond, res.ConsumerPerSecond, res.WebhooksPerSecond)},
		{"lag when the load ended", fmt.Sprintf("outbox %d rows, consumer %d deliveries, deliverer %d rows, webhooks %d; drained %.1fs later",
			res.LagOutbox, res.LagConsumer, res.LagDeliveries, res.LagWebhooks, res.DrainSeconds)},
		{"by stage (p50 / p99)", stagesText(res.Stages)},
		{"bridge process", fmt.Sprintf("peak RSS %.1f MiB, CPU %.2f cores", res.BridgePeakRSSMiB, res.BridgeCPUCores)},
		{"machine", fmt.Sprintf("%.2f of %d cores busy over the load (every process): this bench (writers, receiver) %.2f, PostgreSQL %.2f",
			res.MachineBusyCores, res.MachineCores, res.BenchCPUCores, res.PostgresCPUCores)},
		{"order violations / duplicates / overlaps / bad signatures / not delivered", fmt.Sprintf("%d / %d / %d / %d / %d",
			res.OrderViolations, res.Duplicates, res.Overlaps, res.SignatureFailures, res.NotDelivered)},
		{"engine", fmt.Sprintf("%s (%d deliveries handed to the slow lane)", res.Engine, res.HandedOver)},
	}
	if worst := worstSeconds(res.Seconds, 5); worst != "" {
		rows = append(rows, []string{"p99 second by second", worst})
	}
	rows = append(rows, []string{"relay (commit → produced) p50 / p99", fmt.Sprintf("%.1f / %.1f ms", res.RelayP50Ms, res.RelayP99Ms)},
		[]string{"bridge exports over OTLP", fmt.Sprintf("traces %t, metrics %t", res.TracesExported, res.MetricsExported)},
		[]string{"garbage collection over the load", fmt.Sprintf("bridge %d cycles, longest pause %.1f ms; this bench %d cycles, %.2f cores, peak RSS %.0f MiB (receiver bounded: %t)",
			res.BridgeGCCycles, res.BridgeGCPauseMax, res.BenchGCCycles, res.BenchGCCPUCores, res.BenchPeakRSSMiB, res.ReceiverBounded)})
	for _, s := range res.SlowestSeconds {
		rows = append(rows, []string{fmt.Sprintf("slow second %d", s.Second), secondText(s)})
	}
	for _, m := range res.Minutes {
		rows = append(rows, []string{fmt.Sprintf("minute %d", m.Minute), fmt.Sprintf("%d webhooks, latency p99 %.1f ms; %s; bridge %.2f cores, machine %.2f",
			m.Webhooks, m.LatencyP99Ms, stagesText(m.Stages), m.BridgeCPUCores, m.MachineBusyCores)})
	}
	return printTable(cmd.OutOrStdout(), []string{"MEASURE", "RESULT"}, rows)
}

// secondText is what happened in one second.
func secondText(s pipelinebench.Second) string {
	t := fmt.Sprintf("p99 %.0f ms (max %.0f), relay p99 %.0f ms, produced→fetched p99 %.0f ms; "+
		"bridge GC %d (pause %.1f ms, CPU %.0f ms, heap %.0f MiB, RSS %.0f MiB); bench GC %d (pause %.1f ms, CPU %.0f ms, heap %.0f MiB, RSS %.0f MiB, run-queue wait p99 %.1f ms); "+
		"CPU: machine %.2f, %s; PostgreSQL: checkpoint %d buffers, backends %d",
		s.LatencyP99Ms, s.LatencyMaxMs, s.RelayP99Ms, s.KafkaFetchP99Ms,
		s.BridgeGCCycles, s.BridgeGCPauseMs, s.BridgeGCCPUMs, s.BridgeHeapMiB, s.BridgeRSSMiB,
		s.BenchGCCycles, s.BenchGCPauseMs, s.BenchGCCPUMs, s.BenchHeapMiB, s.BenchRSSMiB, s.BenchSchedP99Ms,
		s.MachineBusyCores, s.TopProcesses, s.CheckpointBuffers, s.BackendBuffers)
	if s.Autovacuum != "" {
		t += ", autovacuum: " + s.Autovacuum
	}
	if s.Maintained != "" {
		t += ", autovacuum done: " + s.Maintained
	}
	if s.PostgresWaits != "" {
		t += ", waits: " + s.PostgresWaits
	}
	if len(s.BridgeLog) > 0 {
		t += "; bridge log: " + strings.Join(s.BridgeLog, " | ")
	}
	return t
}

func stagesText(s pipelinebench.Stages) string {
	return fmt.Sprintf("relay %.0f / %.0f ms, consumer %.0f / %.0f ms, deliverer %.0f / %.0f ms "+
		"(to request %.0f / %.0f, request %.1f / %.1f, to outcome %.0f / %.0f); %d relay marks, %d consumer batches, %d outcome batches",
		s.RelayP50Ms, s.RelayP99Ms, s.ConsumerP50Ms, s.ConsumerP99Ms, s.DelivererP50Ms, s.DelivererP99Ms,
		s.ToRequestP50Ms, s.ToRequestP99Ms, s.RequestP50Ms, s.RequestP99Ms, s.RecordP50Ms, s.RecordP99Ms,
		s.RelayMarks, s.ConsumerBatches, s.OutcomeBatches)
}

// worstSeconds summarises the per-second p99: its median over the seconds
// and the n worst seconds, each with the machine's CPU in it, so that a tail
// of a few stalls shows as such.
func worstSeconds(secs []pipelinebench.Second, n int) string {
	var busy []pipelinebench.Second
	for _, s := range secs {
		if s.Webhooks > 0 {
			busy = append(busy, s)
		}
	}
	if len(busy) == 0 {
		return ""
	}
	p99s := make([]float64, len(busy))
	for i, s := range busy {
		p99s[i] = s.LatencyP99Ms
	}
	slices.Sort(p99s)
	slices.SortFunc(busy, func(a, b pipelinebench.Second) int { return cmp.Compare(b.LatencyP99Ms, a.LatencyP99Ms) })
	parts := make([]string, 0, n)
	for _, s := range busy[:min(n, len(busy))] {
		parts = append(parts, fmt.Sprintf("%ds: %.0f ms (machine %.2f)", s.Second, s.LatencyP99Ms, s.MachineBusyCores))
	}
	return fmt.Sprintf("median of %d seconds %.0f ms; worst %s", len(busy), p99s[len(p99s)/2], strings.Join(parts, ", "))
}
