package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/e2e"
	"github.com/outboxbridge/bridge/internal/jaegerquery"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/tracing"
)

// fetchTrace reads the trace from Jaeger's query API through the console's
// own reader (jaegerquery), keyed by span id; nil while Jaeger does not have
// it yet.
func fetchTrace(ctx context.Context, query, traceID string) (map[string]jaegerquery.Span, error) {
	tr, err := jaegerquery.New(query).Get(ctx, traceID)
	if errors.Is(err, jaegerquery.ErrNotFound) {
		return nil, nil // not (yet) there
	}
	if err != nil {
		return nil, err
	}
	spans := map[string]jaegerquery.Span{}
	for _, s := range tr.Spans {
		spans[s.ID] = s
	}
	return spans, nil
}

// TestEndToEndTraceInJaeger checks the one-trace promise: an application
// span enqueues an event; the relay, the consumer and the deliverer — three
// tracer providers with distinct service names, exporting over OTLP/HTTP to
// the real Jaeger v2 — carry it through the real Kafka broker to an httptest
// receiver; Jaeger's query API then shows one trace holding the
// application's span, "publish <topic>", "process <topic>" and the webhook
// HTTP client span, each the child of the one before, and the receiver's
// traceparent carries the same trace id.
//
// On the fast lane (the default) the deliverer reads the record itself, so
// there is no "process <topic>" span: the HTTP client span is the child of
// "publish <topic>", in the same trace.
func TestEndToEndTraceInJaeger(t *testing.T) {
	t.Run("fast lane", func(t *testing.T) { testEndToEndTraceInJaeger(t, true) })
	t.Run("row engine", func(t *testing.T) { testEndToEndTraceInJaeger(t, false) })
}

func testEndToEndTraceInJaeger(t *testing.T, fastLane bool) {
	t.Parallel()
	otlp, query := testkit.Jaeger(t)
	brokers := kafkatest.RealBrokers(t)
	topic := kafkatest.CreateTopic(t, brokers, 3, nil)

	ctx := context.Background()
	newTP := func(service string) *tracing.Provider {
		t.Helper()
		p, err := tracing.New(ctx, tracing.Config{
			ServiceName: service,
			Endpoint:    "http://" + otlp + "/v1/traces",
			Protocol:    tracing.ProtocolHTTP,
			Resource:    []attribute.KeyValue{attribute.String("test.name", t.Name())},
		})
		if err != nil {
			t.Fatalf("tracing.New(%s): %v", service, err)
		}
		t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
		return p
	}
	const (
		appService     = "e2e-application"
		relayService   = "outbox-bridge-relay"
		consumeService = "outbox-bridge-consume"
		deliverService = "outbox-bridge-deliver"
	)
	appTP, relayTP, consumeTP, deliverTP := newTP(appService), newTP(relayService), newTP(consumeService), newTP(deliverService)

	p := e2e.New(t, e2e.Config{Brokers: brokers, Topic: topic,
		RelayTP: relayTP, ConsumerTP: consumeTP, DeliverTP: deliverTP})
	if fastLane {
		p.StartFastLane()
	} else {
		p.StartConsumerAndDeliverer()
	}
	p.StartRelay(0)

	actx, appSpan := appTP.Tracer("e2e-app").Start(ctx, "PUT /assets/e2e", trace.WithSpanKind(trace.SpanKindServer))
	id := p.Enqueue(actx, "asset-e2e", `{"title":"traced end to end"}`)
	appSpan.End()
	traceID := appSpan.SpanContext().TraceID().String()
	appSpanID := appSpan.SpanContext().SpanID().String()
	t.Logf("event %s in trace %s (%s/trace/%s)", id, traceID, query, traceID)

	testkit.Eventually(t, 60*time.Second, func() string {
		if len(p.Recv.Traceparents(id)) == 0 {
			return "the receiver has not got the webhook"
		}
		return ""
	})
	p.Stop() // every span has ended
	for _, tp := range []*tracing.Provider{appTP, relayTP, consumeTP, deliverTP} {
		if err := tp.ForceFlush(ctx); err != nil {
			t.Fatalf("flush spans to Jaeger: %v", err)
		}
	}

	var spans map[string]jaegerquery.Span
	var publish, process, client jaegerquery.Span
	testkit.Eventually(t, 60*time.Second, func() string {
		var err error
		spans, err = fetchTrace(ctx, query, traceID)
		if err != nil {
			return err.Error()
		}
		publish, process, client = jaegerquery.Span{}, jaegerquery.Span{}, jaegerquery.Span{}
		for _, s := range spans {
			switch {
			case s.Name == "publish "+topic:
				publish = s
			case s.Name == "process "+topic:
				process = s
			case s.Kind == "client" && s.Service == deliverService:
				client = s
			}
		}
		if _, ok := spans[appSpanID]; !ok || publish.ID == "" || (process.ID == "") != fastLane || client.ID == "" {
			return fmt.Sprintf("trace %s in Jaeger has %d spans %v; waiting for the application, publish, process and HTTP client spans", traceID, len(spans), spans)
		}
		return ""
	})

	app := spans[appSpanID]
	checks := []struct {
		what    string
		span    jaegerquery.Span
		service string
		parent  string
		kind    string
	}{
		{"application span", app, appService, "", "server"},
		{"publish span", publish, relayService, app.ID, "producer"},
		{"process span", process, consumeService, publish.ID, "consumer"},
		{"HTTP client span", client, deliverService, process.ID, "client"},
	}
	if fastLane {
		checks = append(checks[:2], checks[3])
		checks[2].parent = publish.ID
	}
	for _, c := range checks {
		if c.span.Service != c.service {
			t.Errorf("%s %q: service %q, want %q", c.what, c.span.Name, c.span.Service, c.service)
		}
		if c.span.ParentID != c.parent {
			t.Errorf("%s %q: parent %q, want %q", c.what, c.span.Name, c.span.ParentID, c.parent)
		}
		if c.span.Kind != c.kind {
			t.Errorf("%s %q: span.kind %q, want %q", c.what, c.span.Name, c.span.Kind, c.kind)
		}
	}
	got := p.Recv.Traceparents(id)[0]
	gotTrace, gotParent := parseTraceparent(t, got)
	if gotTrace != traceID || gotParent != client.ID {
		t.Errorf("receiver got traceparent %s, want trace %s with parent %s (the HTTP client span)", got, traceID, client.ID)
	}
	chain := make([]string, len(checks))
	for i, c := range checks {
		chain[i] = c.span.Name + " [" + c.span.Service + "]"
	}
	t.Logf("Jaeger trace %s: %s", traceID, strings.Join(chain, " → "))
}
