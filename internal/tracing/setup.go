package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/version"
)

// Protocols accepted in OTEL_EXPORTER_OTLP_PROTOCOL.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// Config is the tracing setup, normally read from the standard OTEL_*
// variables by ConfigFromEnv.
type Config struct {
	// ServiceName is the resource's service.name: OTEL_SERVICE_NAME, else
	// service.name in OTEL_RESOURCE_ATTRIBUTES, else the command's default
	// (outbox-bridge-relay, …).
	ServiceName string
	// Endpoint is the full URL spans are exported to, e.g.
	// http://jaeger:4318/v1/traces. Empty: no exporter — tracing costs
	// nothing, and stored trace context still travels (see Provider).
	Endpoint string
	// Protocol is ProtocolHTTP (default) or ProtocolGRPC.
	Protocol string
	// Sampler decides which new traces are recorded. nil:
	// ParentBased(AlwaysSample()), the SDK's default.
	Sampler sdktrace.Sampler
	// ExportTimeout bounds the flush on Shutdown. Default 5s.
	ExportTimeout time.Duration
	// Resource adds attributes to the SDK's resource (tests). The process's
	// OTEL_RESOURCE_ATTRIBUTES are always read.
	Resource []attribute.KeyValue
}

// ConfigFromEnv reads the standard OTEL_* variables through getenv (nil:
// os.Getenv). defaultService names the command when neither
// OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES does.
//
// The SDK and the OTLP exporters read most of these variables themselves;
// they are parsed here anyway so that a typo (OTEL_TRACES_SAMPLER=always,
// an endpoint without a scheme) stops the command with a one-line
// configuration error (exit 2) instead of being logged and ignored.
// Exporter details this function does not interpret (OTEL_EXPORTER_OTLP_HEADERS,
// _TIMEOUT, _COMPRESSION, _CERTIFICATE) are still read by the exporter.
func ConfigFromEnv(getenv func(string) string, defaultService string) (Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	get := func(k string) string { return strings.TrimSpace(getenv(k)) }
	cfg := Config{ServiceName: get("OTEL_SERVICE_NAME")}
	if cfg.ServiceName == "" {
		cfg.ServiceName = serviceNameFromResourceAttributes(get("OTEL_RESOURCE_ATTRIBUTES"))
	}
	if cfg.ServiceName == "" {
		cfg.ServiceName = defaultService
	}

	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return cfg, nil
	}
	switch exp := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exp {
	case "", "otlp":
	case "none":
		return cfg, nil
	default:
		return cfg, configError("OTEL_TRACES_EXPORTER", exp, "must be otlp or none")
	}

	protoVar := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	cfg.Protocol = get(protoVar)
	if cfg.Protocol == "" {
		protoVar = "OTEL_EXPORTER_OTLP_PROTOCOL"
		cfg.Protocol = get(protoVar)
	}
	switch cfg.Protocol {
	case "":
		cfg.Protocol = ProtocolHTTP
	case ProtocolHTTP, ProtocolGRPC:
	default:
		return cfg, configError(protoVar, cfg.Protocol, "must be http/protobuf or grpc")
	}

	if ep := get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); ep != "" {
		// The signal-specific variable is used as is (OTLP exporter spec).
		if err := checkEndpoint("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ep); err != nil {
			return cfg, err
		}
		cfg.Endpoint = ep
	} else if ep := get("OTEL_EXPORTER_OTLP_ENDPOINT"); ep != "" {
		if err := checkEndpoint("OTEL_EXPORTER_OTLP_ENDPOINT", ep); err != nil {
			return cfg, err
		}
		// The generic variable is a base URL: over HTTP the signal's path
		// is appended; gRPC ignores paths.
		if cfg.Protocol == ProtocolHTTP {
			ep = strings.TrimRight(ep, "/") + "/v1/traces"
		}
		cfg.Endpoint = ep
	}

	sampler, err := samplerFromEnv(get("OTEL_TRACES_SAMPLER"), get("OTEL_TRACES_SAMPLER_ARG"))
	if err != nil {
		return cfg, err
	}
	cfg.Sampler = sampler
	return cfg, nil
}

func configError(name, value, problem string) error {
	return &config.Error{Var: name, Value: value, Problem: problem}
}

func checkEndpoint(name, ep string) error {
	u, err := url.Parse(ep)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return configError(name, ep, "must be an http:// or https:// URL, e.g. http://jaeger:4318")
	}
	return nil
}

// samplerFromEnv maps OTEL_TRACES_SAMPLER and its argument onto a sampler.
// The default, parentbased_always_on, records every trace an upstream
// recorded: an application that samples its requests decides for the whole
// chain, so the bridge never cuts a sampled trace in half.
func samplerFromEnv(name, arg string) (sdktrace.Sampler, error) {
	ratio := func() (float64, error) {
		if arg == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return 0, configError("OTEL_TRACES_SAMPLER_ARG", arg, "must be a ratio between 0 and 1")
		}
		return r, nil
	}
	switch strings.ToLower(name) {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, err
		}
		return sdktrace.TraceIDRatioBased(r), nil
	case "parentbased_traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, err
		}
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), nil
	default:
		return nil, configError("OTEL_TRACES_SAMPLER", name,
			"must be one of parentbased_always_on, parentbased_always_off, always_on, always_off, traceidratio, parentbased_traceidratio")
	}
}

// serviceNameFromResourceAttributes returns service.name from an
// OTEL_RESOURCE_ATTRIBUTES value (key=value pairs, comma-separated,
// values percent-encoded), "" if absent.
func serviceNameFromResourceAttributes(s string) string {
	for pair := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok || strings.TrimSpace(k) != "service.name" {
			continue
		}
		if dec, err := url.PathUnescape(strings.TrimSpace(v)); err == nil {
			return dec
		}
		return strings.TrimSpace(v)
	}
	return ""
}

// NewResource describes this process: OTEL_RESOURCE_ATTRIBUTES, the SDK,
// service.name and service.version (from internal/version). Traces and
// metrics share it.
func NewResource(ctx context.Context, serviceName string, extra ...attribute.KeyValue) (*resource.Resource, error) {
	attrs := append([]attribute.KeyValue{
		attribute.String("service.name", serviceName),
		attribute.String("service.version", version.String()),
	}, extra...)
	// Later options win: the explicit service name (already resolved with
	// OTEL_SERVICE_NAME's precedence) overrides OTEL_RESOURCE_ATTRIBUTES.
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
		resource.WithAttributes(attrs...),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	// A partial resource (an unparsable OTEL_RESOURCE_ATTRIBUTES entry) is
	// still usable; the bad entry is dropped.
	return res, nil
}

// Provider is the process's tracer provider.
type Provider struct {
	trace.TracerProvider
	sdk     *sdktrace.TracerProvider // nil when nothing is exported
	timeout time.Duration
}

// Exporting reports whether spans are recorded and exported.
func (p *Provider) Exporting() bool { return p.sdk != nil }

// ForceFlush exports every finished span now (tests, before reading Jaeger).
func (p *Provider) ForceFlush(ctx context.Context) error {
	if p.sdk == nil {
		return nil
	}
	return p.sdk.ForceFlush(ctx)
}

// Shutdown flushes spans still buffered and stops the exporter, waiting at
// most the configured export timeout. Safe to call more than once.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p.sdk == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if err := p.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("flush traces: %w", err)
	}
	return nil
}

// New builds the tracer provider for cfg without touching otel's globals.
//
// With no endpoint it returns the no-op provider: starting a span costs a
// context lookup and nothing else (BenchmarkPublishSpanNoEndpoint). The
// bridge's hops propagate stored trace context with the W3C propagator
// directly (propagation.go), so an application's trace still reaches the
// webhook receiver unbroken even though the bridge records nothing.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	timeout := cfg.ExportTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	if cfg.Endpoint == "" {
		return &Provider{TracerProvider: noop.NewTracerProvider(), timeout: timeout}, nil
	}
	var (
		client otlptrace.Client
	)
	switch cfg.Protocol {
	case ProtocolGRPC:
		client = otlptracegrpc.NewClient(otlptracegrpc.WithEndpointURL(cfg.Endpoint))
	case ProtocolHTTP, "":
		client = otlptracehttp.NewClient(otlptracehttp.WithEndpointURL(cfg.Endpoint))
	default:
		return nil, configError("OTEL_EXPORTER_OTLP_PROTOCOL", cfg.Protocol, "must be http/protobuf or grpc")
	}
	// New does not connect: an unreachable collector costs dropped spans
	// (reported through otel's error handler), never a failed start.
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("create OTLP trace exporter: %w", err)
	}
	res, err := NewResource(ctx, cfg.ServiceName, cfg.Resource...)
	if err != nil {
		return nil, err
	}
	sampler := cfg.Sampler
	if sampler == nil {
		sampler = sdktrace.ParentBased(sdktrace.AlwaysSample())
	}
	sdk := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sampler),
	)
	return &Provider{TracerProvider: sdk, sdk: sdk, timeout: timeout}, nil
}

// Propagator is W3C TraceContext + Baggage, installed globally by Setup for
// instrumentation that reads otel's global propagator (otelhttp, kotel).
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Setup builds the provider for cfg and installs it, with the W3C
// propagators, as otel's globals: instrumentation that falls back to the
// global provider (REFERENCE "OpenTelemetry traps") then records into the
// same exporter instead of a no-op.
func Setup(ctx context.Context, cfg Config) (*Provider, error) {
	p, err := New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	otel.SetTracerProvider(p.TracerProvider)
	otel.SetTextMapPropagator(Propagator())
	return p, nil
}
