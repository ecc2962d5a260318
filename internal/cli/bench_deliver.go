package cli

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/delivery/deliverbench"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
)

func init() { registerBench(newBenchDeliverCmd) }

func newBenchDeliverCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "deliver [--subscriptions S] [--assets K] [--events N]",
		Short: "Deliveries/s, insert→received latency, order and peak heap against an in-process receiver",
		Long: `bench deliver creates a scratch database next to DATABASE_URL's (it needs
CREATEDB; dropped afterwards), S subscriptions pointing at an in-process
loopback receiver, and N pending deliveries spread over K assets per
subscription. It then runs the Deliverer and reports:

  - the drain rate of that backlog (deliveries/s) and the peak Go heap while
    it is pending (sampled from runtime/metrics every 20ms);
  - p50/p99 latency from insert to the receiver, for --live-events inserted at
    --live-rate while the deliverer runs;
  - order violations per (subscription, asset) as the receiver saw them
    (must be 0), duplicates, and rows not delivered;
  - the ceiling: the same HTTP client and receiver with no database, and the
    drain rate as a fraction of it. The ceiling is an upper bound, not a
    target: unsigned posts to a handler that answers before parsing;
  - what the receiver saw in flight: the most requests of one subscription at
    once (must not exceed the cap) and overlapping requests of one stream
    (must be 0) — across --replicas deliverers too;
  - claims and outcome batches: how many, how large, how long.

--failing-subscriptions and --slow-subscriptions make that many endpoints
answer 500 to everything or take --slow-delay per answer (isolation): the
rates, order checks and latencies are then the healthy subscriptions'.

--delivered N puts N deliveries that are already delivered (one attempt
logged each) in the table before the backlog, as WEBHOOK_RETENTION keeps them
behind a deliverer that has run for a while: the claims and outcomes should
cost the same with and without them.

--engine kafka runs the fast lane instead (WEBHOOK_FAST_LANE): the backlog
is produced to a fresh topic of --partitions partitions on KAFKA_BROKERS (one
record per event, fanned out to every subscription: --events deliveries in
--events/--subscriptions records), and --replicas members of a fresh group
drain it, each next to a slow-lane deliverer. It adds the row writes per
delivery to the bridge's tables over the drain (pg_stat_user_tables) and
the deliveries handed to the slow lane; its live phase produces
--live-events/--subscriptions records at --live-rate deliveries/s after the
drain (latency: produce → received). --member-processes runs each member
as a ` + "`bridge deliver`" + ` process of its own (its own Go runtime, as a user runs
replicas) instead of in the bench's process; the CPU per delivery is then
reported for the members and for the bench's process (the receiver) apart.
Either way each member's partitions, deliveries (the receiver's counts per
partition), last delivery and longest run without one are reported, with
whether the group's assignment changed during the drain, the machine's CPU
per delivery that none of the measured processes spent and the machine's
busy share in the second before the drain (something else running).

WEBHOOK_* settings apply (WEBHOOK_WORKERS, WEBHOOK_MAX_IN_FLIGHT_PER_SUBSCRIPTION,
WEBHOOK_CLAIM_LOOPS, WEBHOOK_CLAIM_BYTES, WEBHOOK_POLL_INTERVAL,
WEBHOOK_FAST_LANE_IN_FLIGHT_LIMIT); 127.0.0.0/8 is
allowed for the receiver.`,
		Example: `  DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable \
  bridge bench deliver --subscriptions 10 --assets 100 --events 100000
  bridge bench deliver --events 20000 --live-events 5000 --live-rate 1000 -o json
  bridge bench deliver --assets 1000 --failing-subscriptions 1
  bridge bench deliver --assets 1000 --replicas 3
  bridge bench deliver --assets 1000 --delivered 1000000`,
		Args: cobra.NoArgs,
	}
	subs := c.Flags().Int("subscriptions", 10, "subscriptions (endpoints)")
	assets := c.Flags().Int("assets", 100, "assets per subscription: streams = subscriptions × assets")
	events := c.Flags().Int("events", 100000, "pending deliveries inserted before the deliverer starts")
	live := c.Flags().Int("live-events", 2000, "deliveries inserted while it runs, for latency")
	rate := c.Flags().Int("live-rate", 500, "live deliveries per second")
	workers := c.Flags().Int("workers", 0, "WEBHOOK_WORKERS override")
	maxInFlight := c.Flags().Int("max-in-flight", 0, "WEBHOOK_MAX_IN_FLIGHT_PER_SUBSCRIPTION override")
	claimLoops := c.Flags().Int("claim-loops", 0, "WEBHOOK_CLAIM_LOOPS override")
	replicas := c.Flags().Int("replicas", 1, "deliverers running at once, each with its own pool and id")
	failing := c.Flags().Int("failing-subscriptions", 0, "subscriptions whose endpoint answers 500 to everything")
	slow := c.Flags().Int("slow-subscriptions", 0, "subscriptions whose endpoint takes --slow-delay per answer")
	slowDelay := c.Flags().Duration("slow-delay", 5*time.Second, "answer time of a slow subscription")
	conns := c.Flags().Int32("db-conns", 20, "PostgreSQL pool size for the deliverer")
	keep := c.Flags().Bool("keep-db", false, "do not drop the scratch database")
	delivered := c.Flags().Int("delivered", 0, "deliveries already delivered (one attempt each) in the table before the backlog, as retention keeps them")
	engine := c.Flags().String("engine", "postgres", "postgres (every delivery a claimed row) or kafka (the fast lane)")
	partitions := c.Flags().Int32("partitions", 12, "partitions of the bench topic (--engine kafka)")
	processes := c.Flags().Bool("member-processes", false, "run the fast lane's members as `bridge deliver` processes of their own, as a user runs replicas, instead of in this process (--engine kafka)")
	quietBelow := c.Flags().Float64("quiet-below", 0, "hold the backlog's commit (up to --quiet-wait) until the machine's cores were busy less than this share over a second, the members idle (--engine kafka; 0: do not wait)")
	quietWait := c.Flags().Duration("quiet-wait", time.Minute, "the longest --quiet-below waits before the drain starts anyway")
	profile := c.Flags().String("profile", "", "path prefix: write this process's CPU profile (PREFIX.cpu) and allocations (PREFIX.allocs, base PREFIX.allocs.base) over the drain (--engine kafka)")
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		if *subs < 1 || *assets < 1 || *events < 0 || *live < 0 || *rate < 1 || *conns < 2 {
			return UsageErrorf("--subscriptions, --assets and --live-rate must be at least 1, --events and --live-events not negative, --db-conns at least 2")
		}
		if *maxInFlight < 0 || *claimLoops < 0 || *replicas < 1 || *failing < 0 || *slow < 0 || *slowDelay <= 0 {
			return UsageErrorf("--max-in-flight and --claim-loops must not be negative, --replicas at least 1, --failing-subscriptions and --slow-subscriptions not negative, --slow-delay positive")
		}
		if *delivered < 0 {
			return UsageErrorf("--delivered must not be negative")
		}
		if *failing+*slow >= *subs {
			return UsageErrorf("--failing-subscriptions (%d) + --slow-subscriptions (%d) must leave at least one of the --subscriptions (%d) healthy", *failing, *slow, *subs)
		}
		if *engine != "postgres" && *engine != "kafka" {
			return UsageErrorf("--engine must be postgres or kafka, not %q", *engine)
		}
		if *partitions < 1 {
			return UsageErrorf("--partitions must be at least 1")
		}
		cfg, err := loadConfig(config.Needs{Database: true, Kafka: *engine == "kafka"})
		if err != nil {
			return err
		}
		logger := newLogger(cfg)
		var fast *deliverbench.FastLaneOptions
		if *engine == "kafka" {
			kopts, err := kafkaclient.Options(cfg.Kafka, logger)
			if err != nil {
				return err
			}
			fast = &deliverbench.FastLaneOptions{KafkaOpts: kopts, Partitions: *partitions,
				InFlightLimit: cfg.Webhook.FastLaneInFlightLimit, QuietBelow: *quietBelow, QuietWait: *quietWait}
		}
		if *processes && *engine != "kafka" {
			return UsageErrorf("--member-processes needs --engine kafka")
		}
		dc, err := delivery.ConfigFromEnv(cfg.Webhook)
		if err != nil {
			return err
		}
		if *workers > 0 {
			dc.Workers = *workers
		}
		if *maxInFlight > 0 {
			dc.MaxInFlightPerSubscription = *maxInFlight
		}
		if *claimLoops > 0 {
			dc.ClaimLoops = *claimLoops
		}
		ctx := cmd.Context()
		pool, drop, err := scratchDatabase(ctx, cfg, *conns)
		if err != nil {
			return err
		}
		defer func() {
			pool.Close()
			if !*keep {
				drop()
			}
		}()
		if *processes {
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find this binary to run the members: %w", err)
			}
			stderr := cmd.ErrOrStderr()
			fast.DatabaseURL = withDatabaseName(cfg.Database.URL, pool.Config().ConnConfig.Database)
			fast.Member = func(env []string) *exec.Cmd {
				mc := exec.CommandContext(ctx, exe, "deliver")
				mc.Env = append(os.Environ(), env...)
				mc.Stdout, mc.Stderr = stderr, stderr
				return mc
			}
		}
		res, err := deliverbench.Run(ctx, pool, deliverbench.Options{
			Subscriptions: *subs, Assets: *assets, Events: *events, LiveEvents: *live, LiveRate: *rate,
			Deliverer: dc, Logger: logger, Replicas: *replicas,
			FailingSubscriptions: *failing, SlowSubscriptions: *slow, SlowDelay: *slowDelay, Delivered: *delivered,
			Kafka: fast, Profile: *profile,
		})
		if err != nil {
			return err
		}
		w := cmd.OutOrStdout()
		if out == "json" {
			return printJSON(w, res)
		}
		f := func(v float64) string { return fmt.Sprintf("%.1f", v) }
		rows := [][]string{
			{"streams", fmt.Sprintf("%d subscriptions × %d assets", res.Subscriptions, res.Assets)},
			{"workers", fmt.Sprintf("%d (max %d in flight per subscription)", res.Workers, res.MaxInFlightPerSub)},
			{"backlog", fmt.Sprintf("%d deliveries (inserted in %.1fs)", res.Events, res.InsertSeconds)},
			{"delivered rows kept in the table", fmt.Sprintf("%d (inserted in %.1fs)", res.RetainedDelivered, res.RetainedInsertSeconds)},
			{"drain", fmt.Sprintf("%.1fs", res.DrainSeconds)},
			{"deliveries/s", f(res.DeliveriesPerSecond)},
			{"live", fmt.Sprintf("%d at %d/s", res.LiveEvents, res.LiveRate)},
			{"latency p50 (ms)", f(res.LatencyP50MS)},
			{"latency p99 (ms)", f(res.LatencyP99MS)},
			{"latency max (ms)", f(res.LatencyMaxMS)},
			{"order violations", fmt.Sprint(res.OrderViolations)},
			{"duplicates", fmt.Sprint(res.Duplicates)},
			{"not delivered", fmt.Sprint(res.NotDelivered)},
			{"heap baseline (MiB)", f(res.BaselineHeapMiB)},
			{"heap peak (MiB)", f(res.PeakHeapMiB)},
			{"ceiling: HTTP posts/s, no DB", f(res.CeilingPerSecond) + " (an upper bound, not a target)"},
			{"fraction of the ceiling", fmt.Sprintf("%.2f", res.CeilingFraction)},
			{"replicas × claim loops", fmt.Sprintf("%d × %d", res.Replicas, res.ClaimLoops)},
			{"failing / slow subscriptions", fmt.Sprintf("%d / %d (not counted in the rates)", res.FailingSubscriptions, res.SlowSubscriptions)},
			{"claims", fmt.Sprintf("%d, %.1f rows, %.1f ms each", res.ClaimStatements, res.RowsPerClaim, res.ClaimMS)},
			{"outcome batches", fmt.Sprintf("%d, %.1f outcomes, %.1f ms each", res.OutcomeBatches, res.OutcomesPerBatch, res.OutcomeBatchMS)},
			{"peak in flight per subscription (seen)", fmt.Sprint(res.PeakInFlightPerSub)},
			{"overlapping requests of one stream", fmt.Sprint(res.Overlaps)},
			{"signature failures", fmt.Sprint(res.SignatureFailures)},
			{"CPU per delivery: PostgreSQL / this process (µs)", fmt.Sprintf("%.0f / %.0f", res.PostgresCPUMicrosPerDelivery, res.ProcessCPUMicrosPerDelivery)},
			{"engine", res.Engine},
			{"row writes per delivery: inserts / updates / deletes", fmt.Sprintf("%.3f / %.3f / %.3f",
				res.PostgresInsertsPerDelivery, res.PostgresUpdatesPerDelivery, res.PostgresDeletesPerDelivery)},
			{"handed to the slow lane", fmt.Sprint(res.HandedOver)},
			{"isolations / requests cut", fmt.Sprintf("%d / %d", res.Isolations, res.RequestsCut)},
		}
		if res.Engine == "kafka" {
			rows = append(rows, []string{"CPU per delivery: members' processes / machine / Kafka brokers (µs)",
				fmt.Sprintf("%.0f / %.0f / %.0f (machine %.0f%% busy)", res.MembersCPUMicrosPerDelivery, res.MachineCPUMicrosPerDelivery,
					res.KafkaCPUMicrosPerDelivery, 100*res.MachineBusyFraction)})
			rows = append(rows, []string{"in-flight limit: members' sum over the drain (median, range); one member's range",
				fmt.Sprintf("%s: %d (%d–%d); %d–%d", res.InFlightLimitMode, res.InFlightLimitSumMedian, res.InFlightLimitSumLowest,
					res.InFlightLimitSumHighest, res.InFlightLimitMemberLowest, res.InFlightLimitMemberHighest)})
			rows = append(rows, []string{"CPU per delivery outside the measured processes (µs); machine busy the second before the drain",
				fmt.Sprintf("%.0f; %.0f%% (waited %.1fs for quiet, timed out: %v)", res.UnattributedCPUMicrosPerDelivery,
					100*res.MachineBusyBeforeFraction, res.QuietWaitSeconds, res.QuietTimedOut)})
			rows = append(rows, []string{"members: partitions / deliveries / last delivery (s) / longest gap (s)",
				fmt.Sprintf("%v / %v / %v / %v (reassigned during the drain: %v)", res.MemberPartitions, res.MemberDeliveries,
					res.MemberDoneSeconds, res.MemberLongestGapSeconds, res.GroupReassignedDuringDrain)})
		}
		for _, iv := range res.LiveIntervals {
			rows = append(rows, []string{fmt.Sprintf("live from %.0fs", iv.FromSeconds),
				fmt.Sprintf("claims %d × %.1f ms (%.1f rows), outcome batches %.1f ms, p99 %.1f ms of %d",
					iv.ClaimStatements, iv.ClaimMS, iv.RowsPerClaim, iv.OutcomeBatchMS, iv.LatencyP99MS, iv.Received)})
		}
		if err := printTable(w, []string{"MEASURE", "VALUE"}, rows); err != nil {
			return err
		}
		if res.OrderViolations > 0 || res.NotDelivered > 0 || res.Overlaps > 0 || res.SignatureFailures > 0 ||
			res.PeakInFlightPerSub > int64(res.MaxInFlightPerSub) {
			return fmt.Errorf("%d order violations, %d deliveries not delivered, %d overlapping requests, %d signature failures, %d in flight to one subscription (cap %d)",
				res.OrderViolations, res.NotDelivered, res.Overlaps, res.SignatureFailures, res.PeakInFlightPerSub, res.MaxInFlightPerSub)
		}
		return nil
	})
	return c
}

// scratchDatabase creates and migrates a database of its own next to
// DATABASE_URL's, so a benchmark never writes into real subscriptions.
func scratchDatabase(ctx context.Context, cfg *config.Config, conns int32) (*pgxpool.Pool, func(), error) {
	admin, err := database.Connect(ctx, cfg.Database)
	if err != nil {
		return nil, nil, err
	}
	name := fmt.Sprintf("bridge_bench_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		admin.Close()
		return nil, nil, fmt.Errorf("create scratch database %s (the bench needs CREATEDB): %w", name, err)
	}
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(dctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		admin.Close()
	}
	dbc := cfg.Database
	dbc.URL = withDatabaseName(cfg.Database.URL, name)
	dbc.MaxConns = conns
	pool, err := database.Connect(ctx, dbc)
	if err != nil {
		drop()
		return nil, nil, err
	}
	if _, err := database.Migrate(ctx, pool, nil); err != nil {
		pool.Close()
		drop()
		return nil, nil, err
	}
	return pool, drop, nil
}

// withDatabaseName points a URL or key=value DSN at another database.
func withDatabaseName(dsn, name string) string {
	if strings.Contains(dsn, "://") {
		if u, err := url.Parse(dsn); err == nil {
			u.Path = "/" + name
			return u.String()
		}
	}
	return dsn + " dbname=" + name
}
