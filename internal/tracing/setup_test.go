package tracing

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/config"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		env          map[string]string
		wantService  string
		wantEndpoint string
		wantProtocol string
		wantSampler  string // Sampler.Description(); "" = don't check
		wantErrVar   string
	}{
		{name: "nothing set: no exporter, command's service name",
			env: nil, wantService: "outbox-bridge-relay", wantProtocol: ProtocolHTTP,
			wantSampler: "ParentBased{root:AlwaysOnSampler,remoteParentSampled:AlwaysOnSampler,remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}"},
		{name: "generic endpoint over http gets the traces path",
			env:         map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318/"},
			wantService: "outbox-bridge-relay", wantEndpoint: "http://jaeger:4318/v1/traces", wantProtocol: ProtocolHTTP},
		{name: "generic endpoint over grpc is used as is",
			env:         map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			wantService: "outbox-bridge-relay", wantEndpoint: "http://jaeger:4317", wantProtocol: ProtocolGRPC},
		{name: "signal endpoint wins and is used as is",
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
				"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://b:443/custom/path"},
			wantService: "outbox-bridge-relay", wantEndpoint: "https://b:443/custom/path", wantProtocol: ProtocolHTTP},
		{name: "signal protocol wins",
			env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
				"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"},
			wantService: "outbox-bridge-relay", wantEndpoint: "http://c:4317", wantProtocol: ProtocolGRPC},
		{name: "OTEL_SERVICE_NAME beats resource attributes",
			env:         map[string]string{"OTEL_SERVICE_NAME": "svc", "OTEL_RESOURCE_ATTRIBUTES": "service.name=other"},
			wantService: "svc", wantProtocol: ProtocolHTTP},
		{name: "service.name from resource attributes beats the default",
			env:         map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod, service.name=my%20relay"},
			wantService: "my relay", wantProtocol: ProtocolHTTP},
		{name: "traces exporter none disables export",
			env:         map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318"},
			wantService: "outbox-bridge-relay"},
		{name: "SDK disabled disables export",
			env:         map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318"},
			wantService: "outbox-bridge-relay"},
		{name: "always_on", env: map[string]string{"OTEL_TRACES_SAMPLER": "always_on"},
			wantService: "outbox-bridge-relay", wantProtocol: ProtocolHTTP, wantSampler: "AlwaysOnSampler"},
		{name: "always_off", env: map[string]string{"OTEL_TRACES_SAMPLER": "always_off"},
			wantService: "outbox-bridge-relay", wantProtocol: ProtocolHTTP, wantSampler: "AlwaysOffSampler"},
		{name: "traceidratio with arg", env: map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
			wantService: "outbox-bridge-relay", wantProtocol: ProtocolHTTP, wantSampler: "TraceIDRatioBased{0.25}"},
		{name: "parentbased_traceidratio", env: map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"},
			wantService: "outbox-bridge-relay", wantProtocol: ProtocolHTTP,
			wantSampler: "ParentBased{root:TraceIDRatioBased{0.5},remoteParentSampled:AlwaysOnSampler,remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}"},
		{name: "unknown sampler", env: map[string]string{"OTEL_TRACES_SAMPLER": "sometimes"}, wantErrVar: "OTEL_TRACES_SAMPLER"},
		{name: "ratio out of range", env: map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, wantErrVar: "OTEL_TRACES_SAMPLER_ARG"},
		{name: "unknown protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, wantErrVar: "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{name: "endpoint without scheme", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "jaeger:4318"}, wantErrVar: "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErrVar: "OTEL_TRACES_EXPORTER"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := ConfigFromEnv(envOf(tt.env), "outbox-bridge-relay")
			if tt.wantErrVar != "" {
				var ce *config.Error
				if !errors.As(err, &ce) || ce.Var != tt.wantErrVar {
					t.Fatalf("error = %v, want a config error naming %s", err, tt.wantErrVar)
				}
				return
			}
			if err != nil {
				t.Fatalf("ConfigFromEnv: %v", err)
			}
			if cfg.ServiceName != tt.wantService || cfg.Endpoint != tt.wantEndpoint || cfg.Protocol != tt.wantProtocol {
				t.Errorf("got service=%q endpoint=%q protocol=%q, want %q %q %q",
					cfg.ServiceName, cfg.Endpoint, cfg.Protocol, tt.wantService, tt.wantEndpoint, tt.wantProtocol)
			}
			if tt.wantSampler != "" {
				if cfg.Sampler == nil || cfg.Sampler.Description() != tt.wantSampler {
					t.Errorf("sampler = %v, want %s", cfg.Sampler, tt.wantSampler)
				}
			}
		})
	}
}

// With no endpoint the provider records nothing, yet a stored trace context
// still flows through a span started under it: the webhook receiver sees the
// application's trace even when the bridge exports nothing.
func TestNoEndpointIsNoopButPropagates(t *testing.T) {
	t.Parallel()
	p, err := New(context.Background(), Config{ServiceName: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Exporting() {
		t.Fatal("Exporting() with no endpoint")
	}
	const stored = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := ContextWithRemoteParent(context.Background(), stored, "")
	ctx, span := p.Tracer("t").Start(ctx, "publish t", trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	if span.IsRecording() {
		t.Error("span is recording without an exporter")
	}
	if tp, _ := Traceparent(ctx); tp != stored {
		t.Errorf("traceparent after a no-op span = %q, want the stored %q", tp, stored)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// otlpReceiver is an OTLP/HTTP endpoint that records the paths and the
// number of export requests it got.
type otlpReceiver struct {
	mu    sync.Mutex
	paths []string
	bytes int
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.paths = append(r.paths, req.URL.Path)
	r.bytes += len(b)
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// The generic OTEL_EXPORTER_OTLP_ENDPOINT gets /v1/traces appended, and
// Shutdown flushes what the batcher still holds.
func TestExportOverHTTPAndFlushOnShutdown(t *testing.T) {
	t.Parallel()
	recv := &otlpReceiver{}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	cfg, err := ConfigFromEnv(envOf(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL}), "outbox-bridge-test")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Resource = []attribute.KeyValue{attribute.String("test.name", t.Name())}
	p, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Exporting() {
		t.Fatal("not exporting with an endpoint")
	}
	_, span := p.Tracer("t").Start(context.Background(), "publish t")
	if !span.IsRecording() {
		t.Fatal("span not recording")
	}
	span.End()
	// The batcher's timeout is 5s: only Shutdown's flush gets it out now.
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.paths) == 0 || recv.paths[0] != "/v1/traces" || recv.bytes == 0 {
		t.Fatalf("receiver got %v (%d bytes), want one export to /v1/traces", recv.paths, recv.bytes)
	}
}

// A collector that is down costs dropped spans and a bounded wait at exit,
// never a failed start or a hung shutdown.
func TestUnreachableCollectorDoesNotBlock(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there any more
	p, err := New(context.Background(), Config{ServiceName: "x", Endpoint: url + "/v1/traces", Protocol: ProtocolHTTP, ExportTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatalf("New with an unreachable collector: %v", err)
	}
	_, span := p.Tracer("t").Start(context.Background(), "s")
	span.End()
	start := time.Now()
	_ = p.Shutdown(context.Background()) // an error is expected and fine
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Shutdown took %s with an unreachable collector", d)
	}
}

func TestNewResourceServiceNameAndVersion(t *testing.T) {
	t.Parallel()
	res, err := NewResource(context.Background(), "outbox-bridge-relay")
	if err != nil {
		t.Fatal(err)
	}
	got := map[attribute.Key]string{}
	for _, kv := range res.Attributes() {
		got[kv.Key] = kv.Value.Emit()
	}
	if got["service.name"] != "outbox-bridge-relay" || got["service.version"] == "" {
		t.Errorf("resource = %v, want service.name and service.version", got)
	}
}

// BenchmarkPublishSpanNoEndpoint is the cost tracing adds to each relayed
// row when no endpoint is configured: one span shaped like the relay's
// "publish <topic>" under a stored parent, and the traceparent written into
// the record. Compare with BenchmarkPublishSpanSDK (recording, exported to a
// discarding exporter).
func BenchmarkPublishSpanNoEndpoint(b *testing.B) {
	p, err := New(context.Background(), Config{})
	if err != nil {
		b.Fatal(err)
	}
	benchmarkPublishSpan(b, p.TracerProvider)
}

func BenchmarkPublishSpanSDK(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}))
	defer tp.Shutdown(context.Background()) //nolint:errcheck
	benchmarkPublishSpan(b, tp)
}

// BenchmarkPublishPropagationOnly is the floor: restoring the stored
// context and writing the traceparent header, which the relay does with or
// without tracing. NoEndpoint minus this is what a no-op span costs.
func BenchmarkPublishPropagationOnly(b *testing.B) {
	const stored = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	b.ReportAllocs()
	for b.Loop() {
		ctx := ContextWithRemoteParent(context.Background(), stored, "")
		if tp, _ := Traceparent(ctx); !strings.HasPrefix(tp, "00-4bf92f35") {
			b.Fatal("trace lost")
		}
	}
}

func benchmarkPublishSpan(b *testing.B, tp trace.TracerProvider) {
	tracer := tp.Tracer("bench")
	const stored = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "kafka"),
		attribute.String("messaging.destination.name", "assets"),
		attribute.String("messaging.message.id", "0192b1e4-8a3c-7d2e-9f10-2b3c4d5e6f70"),
		attribute.String("messaging.kafka.message.key", "asset-42"),
	}
	b.ReportAllocs()
	for b.Loop() {
		ctx := ContextWithRemoteParent(context.Background(), stored, "")
		ctx, span := tracer.Start(ctx, "publish assets", trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
		if tp, _ := Traceparent(ctx); !strings.HasPrefix(tp, "00-4bf92f35") {
			b.Fatal("trace lost")
		}
		span.End()
	}
}

type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }
