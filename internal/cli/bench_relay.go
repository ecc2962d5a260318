package cli

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/bench/relaybench"
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
  - a second PostgreSQL ceiling: the relay's own statements (fence, claim
    with payloads, predecessor check, fenced mark) one after the other, on
    a backlog of the drain's size;
  - p50/p99 commit→ack latency (COMMIT returned → the broker's ack) at a
    fixed offered rate, from --writers writers committing --tx-events
    events per transaction, with the rate they achieved.

--replicas N runs N relays in this process, each with its own Kafka client
and connection pool; --relays-first starts them before the backlog is
written and writes it once they have spread the lanes, so the drain is timed
from the backlog's commit and not from the replicas' hand-over at start.

With --sustain DURATION it instead offers --rate events/s (default 8
writers, 10 events per transaction) for DURATION with the relay running and
prints latency, the achieved rate and the claim's p99 minute by minute
(the pool is then --writers + 16 connections unless --db-conns is given);
--hold-xmin keeps a transaction open in another session meanwhile (the
xmin horizon is pinned, so vacuum cannot clean what the relay marks).

RELAY_* settings apply (RELAY_BATCH_SIZE in particular).`,
		Example: `  KAFKA_BROKERS=127.0.0.1:9092 DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable \
  bridge bench relay --events 200000 --assets 1000 --payload-bytes 300
  bridge bench relay --events 1000000 --rate 1000 -o json
  bridge bench relay --replicas 3 --relays-first
  bridge bench relay --sustain 10m --rate 5000 --hold-xmin`,
		Args: cobra.NoArgs,
	}
	events := c.Flags().Int("events", 100000, "backlog to drain")
	assets := c.Flags().Int("assets", 1000, "assets the events are keyed over")
	payloadBytes := c.Flags().Int("payload-bytes", 300, "payload size in bytes")
	partitions := c.Flags().Int32("partitions", 6, "partitions of the bench topic")
	rate := c.Flags().Int("rate", 500, "offered rate for the latency run (events/s)")
	duration := c.Flags().Duration("rate-duration", 10*time.Second, "length of the latency run")
	replicas := c.Flags().Int("replicas", 1, "relay replicas in this process (each with its own Kafka client and connection pool)")
	relaysFirst := c.Flags().Bool("relays-first", false, "start the relays before writing the backlog, and write it once they have spread the lanes (times the drain without the replicas' hand-over at start)")
	conns := c.Flags().Int32("db-conns", 10, "PostgreSQL pool size (with --sustain: --writers + 16 unless set)")
	writers := c.Flags().Int("writers", 0, "concurrent writers of the offered load (default one per 50 events/s offered, at least 4; 8 with --sustain)")
	txEvents := c.Flags().Int("tx-events", 0, "events per committed transaction of the offered load (default 1; 10 with --sustain)")
	sustain := c.Flags().Duration("sustain", 0, "offer --rate for this long instead of the drain (e.g. 10m)")
	schemaKind := c.Flags().String("schema", "", "json or avro: drain a governed topic (a JSON Schema, validated and framed, or an Avro schema, the JSON payload written as Avro binary; in SCHEMA_REGISTRY_URL) against an ungoverned one, --rounds times each, instead of the drain")
	rounds := c.Flags().Int("rounds", 3, "with --schema: governed/ungoverned drain pairs in the run")
	holdXmin := c.Flags().Bool("hold-xmin", false, "with --sustain: hold a transaction open in another session for the whole run")
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		if *events < 1 || *assets < 1 || *payloadBytes < 2 || *partitions < 1 || *rate < 1 || *duration <= 0 || *replicas < 1 || *writers < 0 || *txEvents < 0 || *sustain < 0 {
			return UsageErrorf("--events, --assets, --partitions, --rate, --replicas must be at least 1, --payload-bytes at least 2, --rate-duration positive, --writers, --tx-events and --sustain not negative")
		}
		if *holdXmin && *sustain == 0 {
			return UsageErrorf("--hold-xmin needs --sustain")
		}
		if *relaysFirst && *sustain > 0 {
			return UsageErrorf("--relays-first is for the drain (--sustain always starts the relays before its load)")
		}
		if *sustain > 0 && !cmd.Flags().Changed("db-conns") {
			// The sustained load's writers and the relay share this pool, and
			// the relay keeps two connections for its LISTENs besides its
			// claim, marks and lease. With 10, the 8 writers waited for a free
			// connection inside their timed transactions (p50 15 ms against
			// 6 ms with 24), fell behind the schedule and never offered
			// 5,000 events/s: the run measured the pool, not the relay.
			*conns = int32(cmp.Or(*writers, relaybench.SustainWriters)) + 16
		}
		switch *schemaKind {
		case "", "json", "avro":
		default:
			return UsageErrorf("--schema must be json or avro, got %q", *schemaKind)
		}
		if *schemaKind != "" && (*sustain > 0 || *rounds < 1) {
			return UsageErrorf("--schema is a drain of its own: not with --sustain, and --rounds must be at least 1")
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
		if *schemaKind != "" {
			reg, err := newSchemaRegistry(cfg)
			if err != nil {
				return err
			}
			if reg == nil {
				return &config.Error{Var: "SCHEMA_REGISTRY_URL", Problem: "is required by bench relay --schema"}
			}
			res, err := relaybench.SchemaDrain(ctx, pool, kopts, rc, reg, relaybench.SchemaOptions{
				Events: *events, Assets: *assets, PayloadBytes: *payloadBytes, Partitions: *partitions, Rounds: *rounds, Kind: *schemaKind,
			}, progress)
			if err != nil {
				return err
			}
			if out == "json" {
				return printJSON(cmd.OutOrStdout(), res)
			}
			return printTable(cmd.OutOrStdout(), []string{"MEASURE", "RESULT"}, [][]string{
				{"backlog per drain", fmt.Sprintf("%d events over %d assets, %d-byte payloads", res.Events, res.Assets, res.PayloadBytes)},
				{"ungoverned drain", fmt.Sprintf("%.0f events/s (median; rounds %s)", res.UngovernedDrainRate, rates(res.UngovernedDrainRates))},
				{"governed drain (" + map[string]string{"json": "JSON Schema", "avro": "Avro"}[res.Schema] + ")", fmt.Sprintf("%.0f events/s (median; rounds %s), schema id %d", res.GovernedDrainRate, rates(res.GovernedDrainRates), res.SchemaID)},
				{"governed / ungoverned", fmt.Sprintf("%.0f%%", 100*res.GovernedRatio)},
				{"ceiling: Kafka produce", fmt.Sprintf("%.0f records/s", res.CeilingProduce)},
				{"value hook per event", fmt.Sprintf("ungoverned %.0f ns, governed %.0f ns", res.ValueUngovernedNs, res.ValueGovernedNs)},
			})
		}
		if *sustain > 0 {
			if !cmd.Flags().Changed("rate") {
				*rate = 5000
			}
			res, err := relaybench.Sustain(ctx, pool, kopts, rc, relaybench.SustainOptions{
				Duration: *sustain, Rate: *rate, Writers: *writers, TxEvents: *txEvents, Assets: *assets,
				Partitions: *partitions, Replicas: *replicas, HoldXmin: *holdXmin,
			}, progress)
			if res != nil {
				if out == "json" {
					if perr := printJSON(cmd.OutOrStdout(), res); perr != nil {
						return perr
					}
				} else if perr := printBenchSustain(cmd, res); perr != nil {
					return perr
				}
			}
			return err
		}
		res, err := relaybench.Run(ctx, pool, kopts, rc, relaybench.Options{
			Events: *events, Assets: *assets, PayloadBytes: *payloadBytes, Partitions: *partitions,
			Rate: *rate, RateDuration: *duration, Replicas: *replicas, RelaysFirst: *relaysFirst, Writers: *writers, TxEvents: *txEvents,
		}, progress)
		if err != nil {
			return err
		}
		if out == "json" {
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
	})
	return c
}

func rates(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.0f", x)
	}
	return strings.Join(parts, ", ")
}

func printBenchRelay(cmd *cobra.Command, res *relaybench.Result) error {
	{
		rows := [][]string{
			{"backlog", fmt.Sprintf("%d events over %d assets, %d-byte payloads (filled in %.1fs)", res.Events, res.Assets, res.PayloadBytes, res.FillSeconds)},
			{"relay drain", fmt.Sprintf("%.0f events/s (%.1fs, %d replica(s), batch %d%s)", res.DrainRate, res.DrainSeconds, res.Replicas, res.BatchSize,
				map[bool]string{true: ", relays started before the backlog"}[res.RelaysFirst])},
			{"ceiling: PostgreSQL claim+mark", fmt.Sprintf("%.0f rows/s (one statement on a table of rows with a status, same backlog size)", res.CeilingClaimMark)},
			{"ceiling: relay's statements", fmt.Sprintf("%.0f rows/s (fence, batch pages, held rows, predecessors, positions; no Kafka)", res.CeilingRelayStatements)},
			{"ceiling: Kafka produce", fmt.Sprintf("%.0f records/s", res.CeilingProduce)},
			{"relay / lower ceiling", fmt.Sprintf("%.0f%%", 100*res.DrainRate/min(res.CeilingClaimMark, res.CeilingProduce))},
			{"relay / claim+mark ceiling", fmt.Sprintf("%.0f%%", 100*res.DrainRate/res.CeilingClaimMark)},
			{"claim while draining", fmt.Sprintf("p50 %.1f ms, p99 %.1f ms, max %.1f ms", res.ClaimP50Ms, res.ClaimP99Ms, res.ClaimMaxMs)},
			{"commit→ack latency", fmt.Sprintf("p50 %.1f ms, p99 %.1f ms, max %.1f ms at %d events/s offered, %.0f achieved (%d writers, %d event(s)/tx, %d events)",
				res.LatencyP50Ms, res.LatencyP99Ms, res.LatencyMaxMs, res.LatencyOffered, res.LatencyAchieved, res.LatencyWriters, res.LatencyTxEvents, res.LatencyEvents)},
			{"commit→ack steps", steps(res.LatencySteps, res.LatencySlowSteps)},
			{"commit→ack by relay state", details(res.LatencyDetail, res.LatencySlowDetail)},
			{"produce requests meanwhile", fmt.Sprintf("%d, round trip p50 %.1f ms, p99 %.1f ms, max %.1f ms", res.ProduceRequests, res.ProduceRequestP50Ms, res.ProduceRequestP99Ms, res.ProduceRequestMaxMs)},
			{"per-key order (read back)", fmt.Sprintf("%d records verified, %d keys out of order", res.Verified, res.OrderViolations)},
			{"outbox row writes while draining", fmt.Sprintf("%.2f UPDATEs and %.2f DELETEs per event, %d dead tuples at the end",
				res.OutboxUpdatesPerEvent, res.OutboxDeletesPerEvent, res.OutboxDeadTuples)},
			{"peak heap while draining", fmt.Sprintf("%.1f MiB (baseline %.1f MiB)", res.PeakHeapMiB, res.BaselineHeapMiB)},
		}
		return printTable(cmd.OutOrStdout(), []string{"MEASURE", "RESULT"}, rows)
	}
}

// steps describes the mean commit→ack steps of every event and of the
// slowest 1%.
func steps(all, slow relaybench.Breakdown) string {
	f := func(b relaybench.Breakdown) string {
		return fmt.Sprintf("wait for the claim %.1f ms (missed by an earlier claim: %.0f%%), claim %.1f ms, produce until acked %.1f ms",
			b.WaitMs, b.Missed*100, b.ClaimMs, b.ProduceMs)
	}
	return "mean " + f(all) + "; at or above p99 " + f(slow)
}

// details describes what the relay was doing while the events of all and
// of the slowest 1% waited (see relaybench.Detail).
func details(all, slow relaybench.Detail) string {
	f := func(d relaybench.Detail) string {
		return fmt.Sprintf("relay idle until woken %.1f ms, busy with another claim %.1f / produce %.1f / wait for marks %.1f ms; own claim %.1f, building records %.1f, to the broker's ack %.1f ms",
			d.WakeMs, d.BusyClaimMs, d.BusyProduceMs, d.BusyMarksMs, d.ClaimMs, d.BuildMs, d.BrokerMs)
	}
	return "mean " + f(all) + "; at or above p99 " + f(slow)
}

func printBenchSustain(cmd *cobra.Command, res *relaybench.SustainResult) error {
	rows := [][]string{
		{"load", fmt.Sprintf("%d events/s offered, %.0f achieved, %d events in %.0fs (%d writers, %d events/tx)", res.OfferedRate, res.AchievedRate, res.Events, res.DurationSeconds, res.Writers, res.TxEvents)},
		{"relay", fmt.Sprintf("%d replica(s), batch %d, xmin held: %v", res.Replicas, res.BatchSize, res.HoldXmin)},
		{"commit→ack latency", fmt.Sprintf("p50 %.1f ms, p99 %.1f ms, max %.1f ms", res.LatencyP50Ms, res.LatencyP99Ms, res.LatencyMaxMs)},
		{"commit→ack steps", steps(res.LatencySteps, res.LatencySlowSteps)},
		{"commit→ack by relay state", details(res.LatencyDetail, res.LatencySlowDetail)},
		{"claim p99", fmt.Sprintf("first minute %.1f ms, last minute %.1f ms", res.ClaimP99FirstMinuteMs, res.ClaimP99LastMinuteMs)},
		{"outbox dead tuples at end", fmt.Sprintf("%d", res.DeadTuplesAtEnd)},
		{"outbox row writes meanwhile", fmt.Sprintf("%.2f UPDATEs and %.2f DELETEs per event, %d (auto)vacuums", res.OutboxUpdatesPerEvent, res.OutboxDeletesPerEvent, res.OutboxVacuums)},
		{"writers' transactions", fmt.Sprintf("p50 %.1f ms, p99 %.1f ms (BEGIN to COMMIT returned)", res.WriterTxP50Ms, res.WriterTxP99Ms)},
	}
	for _, m := range res.Minutes {
		rows = append(rows, []string{fmt.Sprintf("minute %d", m.Minute), fmt.Sprintf("%d committed (writer tx p99 %.1f ms), %d acked, latency p99 %.1f ms (max %.1f), %d claims p99 %.1f ms, %d dead tuples, WAL %.0f MiB (%d full pages)",
			m.Committed, m.WriterTxP99Ms, m.Acked, m.LatencyP99Ms, m.LatencyMaxMs, m.Claims, m.ClaimP99Ms, m.DeadTuples, m.WALMiB, m.WALFullPageImages)})
	}
	return printTable(cmd.OutOrStdout(), []string{"MEASURE", "RESULT"}, rows)
}
