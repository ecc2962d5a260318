package tracing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/e2e"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/tracing"
)

// Where scripts/services-up.sh starts Jaeger v2.
const (
	defaultJaegerOTLP  = "127.0.0.1:4318"
	defaultJaegerQuery = "http://127.0.0.1:16686"
)

// jaeger returns the OTLP/HTTP address and the query URL of the test Jaeger,
// failing the test under CI=true (skipping otherwise) when it is not there.
func jaeger(t *testing.T) (otlp, query string) {
	t.Helper()
	otlp = cmpOr(os.Getenv("BRIDGE_TEST_JAEGER_OTLP"), defaultJaegerOTLP)
	query = strings.TrimRight(cmpOr(os.Getenv("BRIDGE_TEST_JAEGER_QUERY"), defaultJaegerQuery), "/")
	how := "`make services` (scripts/services-up.sh)"
	conn, err := net.DialTimeout("tcp", otlp, 3*time.Second)
	if err != nil {
		testkit.Unavailable(t, "Jaeger OTLP/HTTP at "+otlp, how, err)
	}
	conn.Close()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(query + "/api/services")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET /api/services: %s", resp.Status)
		}
	}
	if err != nil {
		testkit.Unavailable(t, "Jaeger query at "+query, how, err)
	}
	return otlp, query
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// jaegerTrace is the part of Jaeger's /api/traces/{id} answer the test reads.
type jaegerTrace struct {
	Data []struct {
		TraceID string `json:"traceID"`
		Spans   []struct {
			TraceID       string `json:"traceID"`
			SpanID        string `json:"spanID"`
			OperationName string `json:"operationName"`
			ProcessID     string `json:"processID"`
			References    []struct {
				RefType string `json:"refType"`
				TraceID string `json:"traceID"`
				SpanID  string `json:"spanID"`
			} `json:"references"`
			Tags []struct {
				Key   string `json:"key"`
				Value any    `json:"value"`
			} `json:"tags"`
		} `json:"spans"`
		Processes map[string]struct {
			ServiceName string `json:"serviceName"`
		} `json:"processes"`
	} `json:"data"`
}

// jaegerSpan is one span as the test checks it.
type jaegerSpan struct {
	id, name, service, parent string
	kind                      string
}

func fetchTrace(query, traceID string) (map[string]jaegerSpan, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(query + "/api/traces/" + traceID)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil // not (yet) there
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /api/traces/%s: %s", traceID, resp.Status)
	}
	var jt jaegerTrace
	if err := json.NewDecoder(resp.Body).Decode(&jt); err != nil {
		return nil, fmt.Errorf("decode trace: %w", err)
	}
	spans := map[string]jaegerSpan{}
	for _, tr := range jt.Data {
		for _, s := range tr.Spans {
			js := jaegerSpan{id: s.SpanID, name: s.OperationName, service: tr.Processes[s.ProcessID].ServiceName}
			for _, r := range s.References {
				if r.RefType == "CHILD_OF" && r.TraceID == s.TraceID {
					js.parent = r.SpanID
				}
			}
			for _, tag := range s.Tags {
				if tag.Key == "span.kind" {
					js.kind = fmt.Sprint(tag.Value)
				}
			}
			spans[s.SpanID] = js
		}
	}
	return spans, nil
}

// TestEndToEndTraceInJaeger is the acceptance test: an application
// span enqueues an event; the relay, the consumer and the deliverer — three
// tracer providers with distinct service names, exporting over OTLP/HTTP to
// the real Jaeger v2 — carry it through the real Kafka broker to an httptest
// receiver; Jaeger's query API then shows one trace holding the
// application's span, "publish <topic>", "process <topic>" and the webhook
// HTTP client span, each the child of the one before, and the receiver's
// traceparent carries the same trace id.
func TestEndToEndTraceInJaeger(t *testing.T) {
	t.Parallel()
	otlp, query := jaeger(t)
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
	p.StartConsumerAndDeliverer()
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

	var spans map[string]jaegerSpan
	var publish, process, client jaegerSpan
	testkit.Eventually(t, 60*time.Second, func() string {
		var err error
		spans, err = fetchTrace(query, traceID)
		if err != nil {
			return err.Error()
		}
		publish, process, client = jaegerSpan{}, jaegerSpan{}, jaegerSpan{}
		for _, s := range spans {
			switch {
			case s.name == "publish "+topic:
				publish = s
			case s.name == "process "+topic:
				process = s
			case s.kind == "client" && s.service == deliverService:
				client = s
			}
		}
		if _, ok := spans[appSpanID]; !ok || publish.id == "" || process.id == "" || client.id == "" {
			return fmt.Sprintf("trace %s in Jaeger has %d spans %v; waiting for the application, publish, process and HTTP client spans", traceID, len(spans), spans)
		}
		return ""
	})

	app := spans[appSpanID]
	checks := []struct {
		what    string
		span    jaegerSpan
		service string
		parent  string
		kind    string
	}{
		{"application span", app, appService, "", "server"},
		{"publish span", publish, relayService, app.id, "producer"},
		{"process span", process, consumeService, publish.id, "consumer"},
		{"HTTP client span", client, deliverService, process.id, "client"},
	}
	for _, c := range checks {
		if c.span.service != c.service {
			t.Errorf("%s %q: service %q, want %q", c.what, c.span.name, c.span.service, c.service)
		}
		if c.span.parent != c.parent {
			t.Errorf("%s %q: parent %q, want %q", c.what, c.span.name, c.span.parent, c.parent)
		}
		if c.span.kind != c.kind {
			t.Errorf("%s %q: span.kind %q, want %q", c.what, c.span.name, c.span.kind, c.kind)
		}
	}
	got := p.Recv.Traceparents(id)[0]
	gotTrace, gotParent := parseTraceparent(t, got)
	if gotTrace != traceID || gotParent != client.id {
		t.Errorf("receiver got traceparent %s, want trace %s with parent %s (the HTTP client span)", got, traceID, client.id)
	}
	t.Logf("Jaeger trace %s: %s [%s] → %s [%s] → %s [%s] → %s [%s]", traceID,
		app.name, app.service, publish.name, publish.service, process.name, process.service, client.name, client.service)
}
