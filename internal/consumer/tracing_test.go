package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/logging"
	"github.com/outboxbridge/bridge/internal/testkit"
)

const (
	parentTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentSpanID  = "00f067aa0ba902b7"
	parentTP      = "00-" + parentTraceID + "-" + parentSpanID + "-01"
)

func withTrace(r *kgo.Record, traceparent, tracestate string) *kgo.Record {
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: contract.HeaderTraceparent, Value: []byte(traceparent)})
	if tracestate != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: contract.HeaderTracestate, Value: []byte(tracestate)})
	}
	return r
}

func TestDeliveriesCarryTheProcessSpanContext(t *testing.T) {
	runSuite(t, 1, func(t *testing.T, b *testBundle) {
		b.createTopic(t, b.topic+contract.DeadLetterSuffix, 1)
		b.subscribe(t, []string{"*"}, nil, true)
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(rec))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		logs := &testkit.LogBuffer{}

		good := withTrace(b.record("asset-1", "order.created", 1, `{}`), parentTP, "vendor=1")
		bad := withTrace(b.record("asset-1", "order.created", 2, `not json`), parentTP, "")
		b.produce(t, good, bad)
		c := b.newConsumer(t, func(cfg *Config) {
			cfg.TracerProvider = tp
			cfg.Logger = logging.New(logs, "debug", "json")
		})
		start(t, c)
		b.waitDeliveries(t, 1, 60*time.Second)

		var spans []sdktrace.ReadOnlySpan
		testkit.Eventually(t, 30*time.Second, func() string {
			spans = rec.Ended()
			return testkit.Unless(len(spans) == 2, "%d ended spans", len(spans))
		})
		dedupID, _ := header(good, contract.HeaderDedupID)
		var process sdktrace.ReadOnlySpan
		for _, s := range spans {
			if attrs := attrMap(s.Attributes()); attrs["messaging.message.id"] == dedupID {
				process = s
			}
		}
		if process == nil {
			t.Fatalf("no span with messaging.message.id %s among %d", dedupID, len(spans))
		}
		if process.Name() != "process "+b.topic || process.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("span %q kind %v, want %q CONSUMER", process.Name(), process.SpanKind(), "process "+b.topic)
		}
		if got := process.Parent(); got.TraceID().String() != parentTraceID || got.SpanID().String() != parentSpanID || !got.IsRemote() {
			t.Errorf("parent = %s/%s (remote %v), want the header's %s/%s", got.TraceID(), got.SpanID(), got.IsRemote(), parentTraceID, parentSpanID)
		}
		want := map[string]string{
			"messaging.system":                      "kafka",
			"messaging.destination.name":            b.topic,
			"messaging.message.id":                  dedupID,
			"messaging.kafka.message.key":           "asset-1",
			"messaging.kafka.destination.partition": "0",
			"messaging.kafka.message.offset":        fmt.Sprint(good.Offset),
			"messaging.consumer.group.name":         b.group,
		}
		attrs := attrMap(process.Attributes())
		for k, v := range want {
			if attrs[k] != v {
				t.Errorf("attribute %s = %q, want %q", k, attrs[k], v)
			}
		}

		// The webhook continues from the process span, not from the producer.
		var traceparent, tracestate *string
		if err := b.db.Pool.QueryRow(context.Background(), `SELECT traceparent, tracestate FROM bridge.deliveries`).Scan(&traceparent, &tracestate); err != nil {
			t.Fatal(err)
		}
		wantTP := fmt.Sprintf("00-%s-%s-01", parentTraceID, process.SpanContext().SpanID())
		if traceparent == nil || *traceparent != wantTP {
			t.Errorf("delivery traceparent = %v, want the process span's %s", deref(traceparent), wantTP)
		}
		if tracestate == nil || *tracestate != "vendor=1" {
			t.Errorf("delivery tracestate = %v, want vendor=1", deref(tracestate))
		}

		// Log lines about a record carry its trace and its dedup id.
		badID, _ := header(bad, contract.HeaderDedupID)
		var line map[string]any
		testkit.Eventually(t, 10*time.Second, func() string {
			for l := range strings.SplitSeq(logs.String(), "\n") {
				if strings.Contains(l, `"record dead-lettered"`) {
					return testkit.Unless(json.Unmarshal([]byte(l), &line) == nil, "%s", l)
				}
			}
			return "no dead-letter log line"
		})
		if line["dedup_id"] != badID || line["trace_id"] != parentTraceID {
			t.Errorf("log line %v: want dedup_id %s and trace_id %s", line, badID, parentTraceID)
		}
	})
}

func TestDeliveriesKeepTheHeaderTraceparentWithoutARecordingSpan(t *testing.T) {
	kafkatest.RunParallel(t, func(t *testing.T, be kafkatest.Backend) {
		for name, tp := range map[string]trace.TracerProvider{
			"no SDK":      noop.NewTracerProvider(),
			"not sampled": sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())),
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, be, 1)
				b.subscribe(t, []string{"*"}, nil, true)
				traced := withTrace(b.record("a", "order.created", 1, `{}`), parentTP, "vendor=1")
				untraced := b.record("a", "order.created", 2, `{}`)
				b.produce(t, traced, untraced)
				c := b.newConsumer(t, func(cfg *Config) { cfg.TracerProvider = tp })
				start(t, c)
				b.waitDeliveries(t, 2, 60*time.Second)

				var traceparent, tracestate *string
				if err := b.db.Pool.QueryRow(context.Background(),
					`SELECT traceparent, tracestate FROM bridge.deliveries WHERE asset_seq = 1`).Scan(&traceparent, &tracestate); err != nil {
					t.Fatal(err)
				}
				if deref(traceparent) != parentTP || deref(tracestate) != "vendor=1" {
					t.Errorf("traced record: delivery carries %q/%q, want the header's %q/vendor=1", deref(traceparent), deref(tracestate), parentTP)
				}
				if err := b.db.Pool.QueryRow(context.Background(),
					`SELECT traceparent FROM bridge.deliveries WHERE asset_seq = 2`).Scan(&traceparent); err != nil {
					t.Fatal(err)
				}
				if traceparent != nil {
					t.Errorf("untraced record: delivery carries traceparent %q, want NULL", *traceparent)
				}
			})
		}
	})
}

func attrMap(kvs []attribute.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
