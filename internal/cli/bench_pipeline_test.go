package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

// TestBenchPipelineEndToEnd runs `bridge bench pipeline` for 3 s at 100
// events/s × 2 subscriptions against the real broker, on the row engine
// (--fast-lane=false: relay, consume, deliver): the bridge process
// starts, every event reaches every subscription in order with a verified
// signature, and the JSON reports the latency, stage rates and memory.
// Cost: about 10–15 s (scratch database, consumer group join, the run).
func TestBenchPipelineEndToEnd(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.RealBrokers(t)
	// No BRIDGE_SECRET_KEYS and no BRIDGE_ALLOW_PLAINTEXT_SECRETS: the
	// bench's scratch bridge must start on what a user's shell has.
	r := bridge(t, map[string]string{"DATABASE_URL": pgtest.AdminURL(), "KAFKA_BROKERS": strings.Join(brokers, ",")},
		"bench", "pipeline", "--fast-lane=false", "--rate", "100", "--subscriptions", "2", "--duration", "3s", "--warm-up", "0", "--writers", "2", "--assets", "20", "-o", "json")
	// Exit 1 with "offered rate not reached" is the bench saying a run on
	// a loaded machine does not count as a measurement (CI runs many tests
	// at once: 95 of 100 events/s once); what this test checks, that every
	// event reached every subscription intact and the result was printed,
	// holds either way, so only that exit is let through.
	shortOfRate := r.code == 1 && strings.Contains(r.stderr, "offered rate not reached")
	if r.code != 0 && !shortOfRate {
		t.Fatalf("exit %d\nstderr: %s\nstdout: %s", r.code, r.stderr, r.stdout)
	}
	var res struct {
		Events            int     `json:"events"`
		Webhooks          int64   `json:"webhooks_expected"`
		Achieved          float64 `json:"achieved_events_per_second"`
		P50               float64 `json:"latency_p50_ms"`
		Relay             float64 `json:"relay_events_per_second"`
		Webhook           float64 `json:"webhooks_per_second"`
		RSS               float64 `json:"bridge_peak_rss_mib"`
		BenchCPU          float64 `json:"bench_cpu_cores"`
		PostgresCPU       float64 `json:"postgres_cpu_cores"`
		OrderViolations   int     `json:"order_violations"`
		Overlaps          int     `json:"overlapping_requests"`
		SignatureFailures int     `json:"signature_failures"`
		NotDelivered      int64   `json:"not_delivered"`
		Seconds           []struct {
			Webhooks int `json:"webhooks"`
		} `json:"seconds"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("output is not the JSON result: %v\n%s", err, r.stdout)
	}
	if res.Events != 300 || res.Webhooks != 600 {
		t.Errorf("events %d, webhooks expected %d; want 300 and 600", res.Events, res.Webhooks)
	}
	if res.OrderViolations+res.Overlaps+res.SignatureFailures != 0 || res.NotDelivered != 0 {
		t.Errorf("order violations %d, overlaps %d, signature failures %d, not delivered %d: all must be 0",
			res.OrderViolations, res.Overlaps, res.SignatureFailures, res.NotDelivered)
	}
	if res.P50 <= 0 || res.Relay <= 0 || res.Webhook <= 0 || res.RSS <= 0 {
		t.Errorf("latency p50 %.1f ms, relay %.0f/s, webhooks %.0f/s, bridge RSS %.1f MiB: each must be measured", res.P50, res.Relay, res.Webhook, res.RSS)
	}
	// The bench's own CPU is always visible (its writers and receiver ran
	// for 3 s); PostgreSQL's whenever it runs on this machine.
	if res.BenchCPU <= 0 {
		t.Errorf("bench CPU %.3f cores: must be measured", res.BenchCPU)
	}
	if localPostgres() && res.PostgresCPU <= 0 {
		t.Errorf("PostgreSQL runs on this machine, but its CPU over the load is %.3f cores: must be measured", res.PostgresCPU)
	}
	// Every webhook's latency is in exactly one second of the per-second
	// series.
	var perSecond int
	for _, s := range res.Seconds {
		perSecond += s.Webhooks
	}
	if perSecond != 600 {
		t.Errorf("the seconds hold %d webhooks in %d seconds, want all 600", perSecond, len(res.Seconds))
	}
}

// By default (--fast-lane, as WEBHOOK_FAST_LANE) the bridge delivers from the
// topic: every event reaches every subscription in order, and no delivery
// becomes a row.
func TestBenchPipelineFastLane(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.RealBrokers(t)
	r := bridge(t, map[string]string{"DATABASE_URL": pgtest.AdminURL(), "KAFKA_BROKERS": strings.Join(brokers, ",")},
		"bench", "pipeline", "--rate", "100", "--subscriptions", "2", "--duration", "3s", "--warm-up", "2s", "--writers", "2", "--assets", "20", "-o", "json")
	shortOfRate := r.code == 1 && strings.Contains(r.stderr, "offered rate not reached")
	if r.code != 0 && !shortOfRate {
		t.Fatalf("exit %d\nstderr: %s\nstdout: %s", r.code, r.stderr, r.stdout)
	}
	var res struct {
		Events, OrderViolations, Overlaps, SignatureFailures int
		Webhooks, NotDelivered, HandedOver, LagConsumer      int64
		Engine                                               string
		P50, WarmUp                                          float64
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
		t.Fatalf("output is not the JSON result: %v\n%s", err, r.stdout)
	}
	for key, dst := range map[string]any{"events": &res.Events, "order_violations": &res.OrderViolations,
		"overlapping_requests": &res.Overlaps, "signature_failures": &res.SignatureFailures, "webhooks_expected": &res.Webhooks,
		"not_delivered": &res.NotDelivered, "handed_over_to_slow_lane": &res.HandedOver, "engine": &res.Engine,
		"lag_consumer_deliveries_at_end": &res.LagConsumer, "latency_p50_ms": &res.P50, "warm_up_seconds": &res.WarmUp} {
		if err := json.Unmarshal(raw[key], dst); err != nil {
			t.Fatalf("field %s: %v\n%s", key, err, r.stdout)
		}
	}
	// The 2-s warm-up's events go through the same pipeline and are counted
	// in none of the figures.
	if res.Engine != "kafka" || res.Events != 300 || res.Webhooks != 600 || res.WarmUp != 2 {
		t.Errorf("engine %q, events %d, webhooks expected %d, warm-up %.0fs; want kafka, 300, 600 and 2s", res.Engine, res.Events, res.Webhooks, res.WarmUp)
	}
	if res.OrderViolations+res.Overlaps+res.SignatureFailures != 0 || res.NotDelivered != 0 {
		t.Errorf("order violations %d, overlaps %d, signature failures %d, not delivered %d: all must be 0",
			res.OrderViolations, res.Overlaps, res.SignatureFailures, res.NotDelivered)
	}
	if res.HandedOver != 0 || res.LagConsumer != 0 || res.P50 <= 0 {
		t.Errorf("handed over %d, consumer lag %d, p50 %.1f ms: want no rows, no consumer, a measured latency", res.HandedOver, res.LagConsumer, res.P50)
	}
	// What a slow second was: the relay's part read back from the topic,
	// the bounded receiver, and for the worst seconds the machine's
	// processes and this bench's memory.
	var diag struct {
		RelayP50 float64 `json:"relay_p50_ms"`
		Bounded  bool    `json:"receiver_bounded"`
		Slowest  []struct {
			Webhooks int     `json:"webhooks"`
			Top      string  `json:"top_processes"`
			BenchRSS float64 `json:"bench_rss_mib"`
		} `json:"slowest_seconds"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &diag); err != nil {
		t.Fatal(err)
	}
	if diag.RelayP50 <= 0 || !diag.Bounded || len(diag.Slowest) == 0 || diag.Slowest[0].Webhooks == 0 ||
		diag.Slowest[0].Top == "" || diag.Slowest[0].BenchRSS <= 0 {
		t.Errorf("relay p50 %.1f ms, receiver bounded %t, slowest seconds %+v: want a measured relay part, the bounded receiver, and the slowest seconds with their processes and memory",
			diag.RelayP50, diag.Bounded, diag.Slowest)
	}
}

// localPostgres reports whether /proc shows a process named postgres.
func localPostgres() bool {
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, c := range comms {
		if b, err := os.ReadFile(c); err == nil && strings.TrimSpace(string(b)) == "postgres" {
			return true
		}
	}
	return false
}

func TestBenchPipelineRefusesBadFlagsWithExitTwo(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--rate", "0"}, {"--duration", "10ms"}, {"--subscriptions", "0"}} {
		r := bridge(t, map[string]string{}, append([]string{"bench", "pipeline"}, args...)...)
		if r.code != ExitUsage || !strings.Contains(r.stderr, args[0]) {
			t.Errorf("bench pipeline %v: exit %d, stderr %q; want %d naming %s", args, r.code, r.stderr, ExitUsage, args[0])
		}
	}
}
