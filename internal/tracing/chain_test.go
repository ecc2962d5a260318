package tracing_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/e2e"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/metrics"
	"github.com/outboxbridge/bridge/internal/metrics/metricstest"
	"github.com/outboxbridge/bridge/internal/outboxstore"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// recorded is a tracer provider whose ended spans are kept in memory.
type recorded struct {
	tp  *sdktrace.TracerProvider
	rec *tracetest.SpanRecorder
}

func newRecorded(t *testing.T) recorded {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return recorded{tp: tp, rec: rec}
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// findSpan returns the ended span of r named name whose attribute key has
// value val ("" key: any), failing the test when there is not exactly one.
func findSpan(t *testing.T, r recorded, name string, key attribute.Key, val string) sdktrace.ReadOnlySpan {
	t.Helper()
	// A span ends when its own work returns (an ack callback, a response
	// read), which can be a moment after the next hop already saw the
	// event: wait briefly for it rather than racing it.
	var found []sdktrace.ReadOnlySpan
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		found = found[:0]
		for _, s := range r.rec.Ended() {
			if s.Name() != name {
				continue
			}
			if key != "" && attrs(s)[key].Emit() != val {
				continue
			}
			found = append(found, s)
		}
		if len(found) >= 1 || time.Now().After(deadline) {
			break
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %q with %s=%s, want 1", len(found), name, key, val)
	}
	return found[0]
}

// childOf returns the one ended span of r whose parent is parent.
func childOf(t *testing.T, r recorded, parent trace.SpanContext, kind trace.SpanKind) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		found = found[:0]
		for _, s := range r.rec.Ended() {
			if s.Parent().SpanID() == parent.SpanID() && s.SpanKind() == kind {
				found = append(found, s)
			}
		}
		if len(found) >= 1 || time.Now().After(deadline) {
			break
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d %s spans under %s, want 1", len(found), kind, parent.SpanID())
	}
	return found[0]
}

func wantParent(t *testing.T, what string, child sdktrace.ReadOnlySpan, parent trace.SpanContext) {
	t.Helper()
	if child.SpanContext().TraceID() != parent.TraceID() {
		t.Errorf("%s: trace %s, want %s", what, child.SpanContext().TraceID(), parent.TraceID())
	}
	if child.Parent().SpanID() != parent.SpanID() {
		t.Errorf("%s: parent %s, want %s", what, child.Parent().SpanID(), parent.SpanID())
	}
}

func wantAttrs(t *testing.T, what string, s sdktrace.ReadOnlySpan, want map[attribute.Key]string) {
	t.Helper()
	got := attrs(s)
	for k, v := range want {
		gv, ok := got[k]
		switch {
		case !ok:
			t.Errorf("%s: attribute %s missing (have %v)", what, k, s.Attributes())
		case v != "*" && gv.Emit() != v:
			t.Errorf("%s: %s = %q, want %q", what, k, gv.Emit(), v)
		}
	}
}

// TestTraceChainAcrossTheBridge follows three events through relay →
// Kafka (in-process kfake) → consumer → deliverer → receiver, with an
// in-memory exporter per process:
//
//   - delivered: application span → "publish <topic>" (PRODUCER) → "process
//     <topic>" (CONSUMER) → HTTP CLIENT span, each the child of the one
//     before, with messaging/HTTP attributes; the receiver's traceparent
//     continues the same trace from the client span;
//   - failed at the receiver (500): the client span has error status, the
//     deliverer's log line carries the trace id and dedup id;
//   - parked by the relay (over RELAY_MAX_MESSAGE_BYTES): a "park <topic>"
//     span with an outbox.parked event in the application's trace, a relay
//     log line with the trace id; then replayed after the operator raised the
//     limit: "publish <topic>" with outbox.replayed=true, still a child of the
//     original application span, and the rest of the chain follows.
func TestTraceChainAcrossTheBridge(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Fake(t)
	brokers := cluster.ListenAddrs()
	topic := kafkatest.CreateTopic(t, brokers, 3, nil)
	app, relayR, consumerR, deliverR := newRecorded(t), newRecorded(t), newRecorded(t), newRecorded(t)
	m, err := metrics.New(metrics.Options{RefreshInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown(context.Background()) //nolint:errcheck
	p := e2e.New(t, e2e.Config{Brokers: brokers, Topic: topic,
		RelayTP: relayR.tp, ConsumerTP: consumerR.tp, DeliverTP: deliverR.tp, Metrics: m})
	p.StartConsumerAndDeliverer()
	p.StartRelay(1000)

	// The application: one request (span) per event.
	appTracer := app.tp.Tracer("app")
	enqueueUnder := func(name, asset, payload string) (string, trace.SpanContext) {
		ctx, span := appTracer.Start(context.Background(), name, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		return p.Enqueue(ctx, asset, payload), span.SpanContext()
	}
	okID, okApp := enqueueUnder("PUT /assets/a1", "a1", `{"title":"ok"}`)
	failID := ""
	{
		// The receiver must fail this one before it can arrive.
		ctx, span := appTracer.Start(context.Background(), "PUT /assets/a2", trace.WithSpanKind(trace.SpanKindServer))
		id := p.Enqueue(ctx, "a2", `{"title":"breaks the handler"}`)
		span.End()
		failID = id
		p.Recv.FailFor(id)
		defer func(sc trace.SpanContext) { checkFailed(t, p, deliverR, consumerR, failID, sc) }(span.SpanContext())
	}
	bigID, bigApp := enqueueUnder("PUT /assets/a3", "a3", `{"blob":"`+strings.Repeat("x", 1500)+`"}`)

	testkit.Eventually(t, 30*time.Second, func() string {
		if len(p.Recv.Traceparents(okID)) == 0 || len(p.Recv.Traceparents(failID)) == 0 {
			return "receiver has not got both deliverable events yet"
		}
		if st := p.OutboxStatus(bigID); st != "FAILED" {
			return "oversized row is " + st + ", want FAILED"
		}
		return ""
	})

	// The delivered event's chain.
	pub := findSpan(t, relayR, "publish "+topic, "messaging.message.id", okID)
	if pub.SpanKind() != trace.SpanKindProducer {
		t.Errorf("publish span kind %s", pub.SpanKind())
	}
	wantParent(t, "publish ← application", pub, okApp)
	wantAttrs(t, "publish", pub, map[attribute.Key]string{
		"messaging.system": "kafka", "messaging.destination.name": topic, "messaging.message.id": okID,
		"messaging.kafka.message.key": "a1", "messaging.destination.partition.id": "*", "messaging.kafka.offset": "*",
		"outbox.replayed": "false",
	})
	proc := findSpan(t, consumerR, "process "+topic, "messaging.message.id", okID)
	if proc.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("process span kind %s", proc.SpanKind())
	}
	wantParent(t, "process ← publish", proc, pub.SpanContext())
	wantAttrs(t, "process", proc, map[attribute.Key]string{
		"messaging.system": "kafka", "messaging.destination.name": topic, "messaging.message.id": okID,
		"messaging.consumer.group.name": "g-" + topic,
	})
	client := childOf(t, deliverR, proc.SpanContext(), trace.SpanKindClient)
	wantParent(t, "HTTP client ← process", client, proc.SpanContext())
	wantAttrs(t, "HTTP client", client, map[attribute.Key]string{"http.request.method": "POST", "http.response.status_code": "204"})
	if client.Status().Code == codes.Error {
		t.Errorf("delivered attempt's span has error status %q", client.Status().Description)
	}
	tps := p.Recv.Traceparents(okID)
	traceID, parentID := parseTraceparent(t, tps[0])
	if traceID != okApp.TraceID().String() || parentID != client.SpanContext().SpanID().String() {
		t.Errorf("receiver got traceparent %s, want trace %s from client span %s", tps[0], okApp.TraceID(), client.SpanContext().SpanID())
	}

	// The parked row: its trace says where it stopped, its log line says
	// which trace it belongs to.
	park := findSpan(t, relayR, "park "+topic, "messaging.message.id", bigID)
	wantParent(t, "park ← application", park, bigApp)
	if park.Status().Code != codes.Error || len(park.Events()) == 0 || park.Events()[0].Name != "outbox.parked" {
		t.Errorf("park span: status %v, events %v; want error status and an outbox.parked event", park.Status(), park.Events())
	}
	if line, ok := p.RelayLog.LineWith("parked as FAILED", "dedup_id="+bigID); !ok {
		t.Errorf("no relay log line about parking %s:\n%s", bigID, p.RelayLog)
	} else if !strings.Contains(line, "trace_id="+bigApp.TraceID().String()) {
		t.Errorf("parking log line lacks the event's trace id %s: %s", bigApp.TraceID(), line)
	}

	// The operator raises the limit and replays the row: the replayed send
	// continues the original trace.
	p.StopRelay()
	p.StartRelay(0)
	if replayed, _, err := outboxstore.ReplayIDs(context.Background(), p.DB.Pool, uuids(t, bigID)); err != nil || len(replayed) != 1 {
		t.Fatalf("ReplayIDs = %v, %v", replayed, err)
	}
	testkit.Eventually(t, 30*time.Second, func() string {
		if len(p.Recv.Traceparents(bigID)) == 0 {
			return "replayed event not delivered yet"
		}
		return ""
	})
	rpub := findSpan(t, relayR, "publish "+topic, "messaging.message.id", bigID)
	wantParent(t, "replayed publish ← original application span", rpub, bigApp)
	wantAttrs(t, "replayed publish", rpub, map[attribute.Key]string{"outbox.replayed": "true"})
	rproc := findSpan(t, consumerR, "process "+topic, "messaging.message.id", bigID)
	wantParent(t, "replayed process ← publish", rproc, rpub.SpanContext())
	rclient := childOf(t, deliverR, rproc.SpanContext(), trace.SpanKindClient)
	if got, _ := parseTraceparent(t, p.Recv.Traceparents(bigID)[0]); got != bigApp.TraceID().String() || rclient.SpanContext().TraceID() != bigApp.TraceID() {
		t.Errorf("replayed delivery left the original trace %s (receiver got %s)", bigApp.TraceID(), got)
	}

	// The same small run, as /metrics tells it: 3 events in, 1 parked and
	// replayed, 2 webhooks delivered, 1 dead after a 500.
	testkit.Eventually(t, 10*time.Second, func() string {
		f := metricstest.Scrape(t, m.Handler())
		v := func(name string, labels map[string]string) float64 { x, _ := f.Value(name, labels); return x }
		got := map[string]float64{
			"produced":          v("bridge_relay_produced_total", map[string]string{"topic": topic}),
			"parked poison":     v("bridge_relay_parked_total", map[string]string{"topic": topic, "reason": "poison"}),
			"outbox SENT":       v("bridge_outbox_rows", map[string]string{"status": "SENT"}),
			"outbox FAILED":     v("bridge_outbox_rows", map[string]string{"status": "FAILED"}),
			"consumed":          v("bridge_consumer_records_total", nil),
			"deliveries made":   v("bridge_consumer_deliveries_created_total", nil),
			"attempts 2xx":      v("bridge_delivery_attempts_total", map[string]string{"outcome": "delivered", "status_class": "2xx"}),
			"attempts dead 5xx": v("bridge_delivery_attempts_total", map[string]string{"outcome": "dead", "status_class": "5xx"}),
			"durations":         v("bridge_delivery_attempt_duration_seconds", map[string]string{"outcome": "delivered"}),
			"delivered":         v("bridge_deliveries", map[string]string{"status": "delivered"}),
			"dead":              v("bridge_deliveries", map[string]string{"status": "dead"}),
			"oldest open age":   v("bridge_delivery_oldest_pending_age_seconds", map[string]string{"subscription_id": p.SubID}),
			"lag":               v("bridge_consumer_lag", map[string]string{"topic": topic}),
		}
		want := map[string]float64{
			"produced": 3, "parked poison": 1, "outbox SENT": 3, "outbox FAILED": 0, "consumed": 3, "deliveries made": 3,
			"attempts 2xx": 2, "attempts dead 5xx": 1, "durations": 2,
			"delivered": 2, "dead": 1, "oldest open age": 0, "lag": 0,
		}
		for k, w := range want {
			if got[k] != w {
				return fmt.Sprintf("%s = %v, want %v (all: %v)", k, got[k], w, got)
			}
		}
		if !f.Has("bridge_consumer_lag") {
			return "bridge_consumer_lag missing"
		}
		return ""
	})
}

// checkFailed: the attempt the receiver answered 500 has an error span, and
// the deliverer's log line about it carries the trace id and dedup id.
func checkFailed(t *testing.T, p *e2e.Pipeline, deliverR, consumerR recorded, id string, app trace.SpanContext) {
	t.Helper()
	if t.Failed() {
		return
	}
	proc := findSpan(t, consumerR, "process "+p.Topic, "messaging.message.id", id)
	client := childOf(t, deliverR, proc.SpanContext(), trace.SpanKindClient)
	if client.SpanContext().TraceID() != app.TraceID() {
		t.Errorf("failed attempt's span is in trace %s, want %s", client.SpanContext().TraceID(), app.TraceID())
	}
	wantAttrs(t, "failed HTTP client", client, map[attribute.Key]string{"http.response.status_code": "500"})
	if client.Status().Code != codes.Error {
		t.Errorf("failed attempt's span status = %v, want Error", client.Status())
	}
	var line string
	testkit.Eventually(t, 10*time.Second, func() string {
		var ok bool
		if line, ok = p.DeliverLog.LineWith("dedup_id=" + id); !ok {
			return fmt.Sprintf("no deliverer log line for %s", id)
		}
		return ""
	})
	if !strings.Contains(line, "trace_id="+app.TraceID().String()) {
		t.Errorf("deliverer's log line lacks the event's trace id %s: %s", app.TraceID(), line)
	}
}
