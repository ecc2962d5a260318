package demo

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// JaegerQuery is where scripts/services-up.sh serves Jaeger's query API (that
// Jaeger, built from its Go module, has no UI; the demo draws the trace).
const JaegerQuery = "http://127.0.0.1:16686"

// Summary is what a run found. The JSON form is `bridge demo -o json`.
type Summary struct {
	RunID          string `json:"run_id"`
	Topic          string `json:"topic"`
	Brokers        string `json:"brokers"`
	EmbeddedBroker bool   `json:"embedded_broker"`
	SubscriptionID string `json:"subscription_id"`
	// Database the run used (password redacted).
	Database string `json:"database"`
	// Kept: the run's subscription, deliveries and outbox rows were left
	// in place (--keep).
	Kept bool `json:"kept"`

	// Enqueued events, committed in Transactions transactions.
	Enqueued     int `json:"enqueued"`
	Transactions int `json:"transactions"`
	// Poison: poison events enqueued (0 or 1).
	Poison int `json:"poison"`
	// Relayed: rows the relay marked SENT (acknowledged by the broker).
	Relayed int `json:"relayed"`
	// Failed: rows parked as FAILED; FailedReason is the first one's last_error.
	Failed       int    `json:"failed"`
	FailedReason string `json:"failed_reason,omitempty"`
	// Delivered: distinct events the receiver accepted with a valid signature.
	Delivered int `json:"delivered"`
	// FastLane: delivered from the topic's partitions (WEBHOOK_FAST_LANE);
	// DeliveredFastLane of Delivered came straight from Kafka,
	// DeliveredSlowLane through bridge.deliveries (a stream that was
	// refused, until its backlog there was empty).
	FastLane          bool `json:"fast_lane"`
	DeliveredFastLane int  `json:"delivered_fast_lane"`
	DeliveredSlowLane int  `json:"delivered_slow_lane"`
	// Refused: attempts the receiver answered 500 on purpose
	// (Options.Refusals), each retried to success.
	Refused int `json:"refused"`
	// Dead: deliveries that exhausted their retry schedule.
	Dead int `json:"dead"`
	// Duplicates: repeated copies the receiver ignored (allowed: at least once).
	Duplicates int `json:"duplicates"`
	// Missing: non-poison events enqueued that neither arrived nor died.
	Missing int `json:"missing"`

	// Commit → webhook received, over the events that arrived.
	LatencyP50 time.Duration `json:"latency_p50_ns"`
	LatencyP95 time.Duration `json:"latency_p95_ns"`
	LatencyP99 time.Duration `json:"latency_p99_ns"`
	LatencyMax time.Duration `json:"latency_max_ns"`

	OrderViolations int `json:"order_violations"`
	// Overlaps: requests of one asset's stream that arrived while another was
	// still in flight (the bridge sends one at a time).
	Overlaps          int      `json:"overlapping_requests"`
	SignatureFailures int      `json:"signature_failures"`
	Malformed         int      `json:"malformed"`
	Problems          []string `json:"problems,omitempty"`

	// TracesContinued: arrived events whose traceparent carried the trace
	// they were enqueued in.
	TracesContinued int `json:"traces_continued"`
	// TraceID of the first publish-and-expire transaction: two events, one
	// trace, from the enqueue to both webhook requests.
	TraceID string `json:"trace_id,omitempty"`
	// Waterfall is that trace drawn as text from Jaeger's query API
	// (JAEGER_QUERY_URL); WaterfallError says why it is not there.
	Waterfall      string `json:"waterfall,omitempty"`
	WaterfallError string `json:"waterfall_error,omitempty"`
	Exporting      bool   `json:"exporting_traces"`

	Elapsed time.Duration `json:"elapsed_ns"`
	// Interrupted: stopped by its context (Ctrl-C) before the end.
	Interrupted bool `json:"interrupted"`
	// TimedOut: the last deliveries did not arrive within the timeout.
	TimedOut bool `json:"timed_out"`
}

// Err reports what makes the run a failure: order violations, signature
// failures, malformed requests, or events that never arrived although the run
// was not interrupted. nil for a clean run.
func (s *Summary) Err() error {
	var bad []string
	if s.OrderViolations > 0 {
		bad = append(bad, fmt.Sprintf("%d order violation(s)", s.OrderViolations))
	}
	if s.Overlaps > 0 {
		bad = append(bad, fmt.Sprintf("%d overlapping request(s)", s.Overlaps))
	}
	if s.SignatureFailures > 0 {
		bad = append(bad, fmt.Sprintf("%d signature failure(s)", s.SignatureFailures))
	}
	if s.Malformed > 0 {
		bad = append(bad, fmt.Sprintf("%d malformed request(s)", s.Malformed))
	}
	if s.Missing > 0 && !s.Interrupted {
		bad = append(bad, fmt.Sprintf("%d event(s) never delivered", s.Missing))
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("demo failed: %s", strings.Join(bad, ", "))
}

// percentiles returns the nearest-rank p50, p95, p99 and max of ds.
func percentiles(ds []time.Duration) (p50, p95, p99, maxd time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return at(0.50), at(0.95), at(0.99), s[len(s)-1]
}

// Print writes the summary table for humans.
func (s *Summary) Print(w io.Writer) error {
	var b strings.Builder
	switch {
	case s.Interrupted:
		fmt.Fprintf(&b, "\nInterrupted after %s — the summary so far:\n\n", round(s.Elapsed))
	case s.TimedOut:
		fmt.Fprintf(&b, "\nTimed out waiting for the last deliveries after %s:\n\n", round(s.Elapsed))
	default:
		fmt.Fprintf(&b, "\nDone in %s:\n\n", round(s.Elapsed))
	}
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	row := func(k, v, note string) { fmt.Fprintf(tw, "  %s\t%s\t%s\n", k, v, note) }
	row("enqueued", fmt.Sprint(s.Enqueued), fmt.Sprintf("in %d transactions", s.Transactions))
	row("relayed to Kafka", fmt.Sprint(s.Relayed), "marked SENT after the broker's ack")
	row("delivered", fmt.Sprint(s.Delivered), "distinct webhooks, every signature verified")
	if s.FastLane {
		row("  fast lane", fmt.Sprint(s.DeliveredFastLane), "straight from the topic's partitions; PostgreSQL wrote only the attempt log")
		row("  slow lane", fmt.Sprint(s.DeliveredSlowLane), "streams parked after a refusal, retried from bridge.deliveries, then back to the fast lane")
	}
	if s.Refused > 0 {
		row("refused on purpose", fmt.Sprint(s.Refused), "the receiver answered 500 to these first attempts; each was retried")
	}
	failedNote := "parked: the poison event"
	if s.FailedReason != "" {
		failedNote = "parked: " + s.FailedReason
	}
	row("FAILED (parked)", fmt.Sprint(s.Failed), failedNote)
	row("dead deliveries", fmt.Sprint(s.Dead), "")
	row("duplicates ignored", fmt.Sprint(s.Duplicates), "same webhook-id again (at least once)")
	if s.Missing > 0 {
		row("missing", fmt.Sprint(s.Missing), "enqueued, neither delivered nor dead")
	}
	row("latency commit→webhook", fmt.Sprintf("p50 %s  p95 %s  p99 %s", ms(s.LatencyP50), ms(s.LatencyP95), ms(s.LatencyP99)), fmt.Sprintf("max %s", ms(s.LatencyMax)))
	row("order violations", fmt.Sprint(s.OrderViolations), verdict(s.OrderViolations))
	if s.Overlaps > 0 {
		row("overlapping requests", fmt.Sprint(s.Overlaps), verdict(s.Overlaps))
	}
	row("signature failures", fmt.Sprint(s.SignatureFailures), verdict(s.SignatureFailures))
	if s.Malformed > 0 {
		row("malformed requests", fmt.Sprint(s.Malformed), verdict(s.Malformed))
	}
	row("traces continued", fmt.Sprintf("%d/%d", s.TracesContinued, s.Delivered), "webhook traceparent = the enqueuing transaction's trace")
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range s.Problems {
		fmt.Fprintf(&b, "  ! %s\n", p)
	}
	b.WriteString("\n")
	switch {
	case s.TraceID != "" && s.Exporting:
		fmt.Fprintf(&b, "A trace (a publish-and-expire transaction → relay → consume → both webhooks): %s\n", s.TraceID)
		switch {
		case s.Waterfall != "":
			b.WriteString(s.Waterfall)
		case s.WaterfallError != "":
			fmt.Fprintf(&b, "  (not drawn: %s)\n", s.WaterfallError)
		}
		fmt.Fprintf(&b, "  In the console: http://<HTTP_ADDR>/ui/trace/%s (bridge run with ADMIN_TOKEN and JAEGER_QUERY_URL).\n", s.TraceID)
	case !s.Exporting:
		b.WriteString("Traces: run with OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 (Jaeger from scripts/services-up.sh)\nto get a sample trace drawn here from " + JaegerQuery + "'s query API.\n")
	}
	b.WriteString("Topic: " + s.Topic + " on " + s.Brokers)
	if s.EmbeddedBroker {
		b.WriteString(" (embedded broker, gone with the process)")
	}
	b.WriteString("\n")
	switch {
	case s.Kept:
		fmt.Fprintf(&b, "Kept for a look (DATABASE_URL=%s):\n  bridge outbox failed --topic %s\n  bridge deliveries list --subscription %s\n", s.Database, s.Topic, s.SubscriptionID)
	default:
		b.WriteString("The run's subscription, deliveries and outbox rows are removed; --keep leaves them for\nbridge outbox failed and bridge deliveries list.\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func verdict(n int) string {
	if n == 0 {
		return "ok (must be 0)"
	}
	return "FAIL (must be 0)"
}

func ms(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	default:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
}

func round(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }
