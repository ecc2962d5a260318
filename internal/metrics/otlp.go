package metrics

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// OTLPReader returns a periodic reader that pushes the bridge's metrics over
// OTLP when the standard variables ask for it (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_METRICS_ENDPOINT set, OTEL_METRICS_EXPORTER not "none"),
// and nil otherwise; /metrics serves Prometheus either way. The exporters read
// the endpoint, headers, timeout and TLS variables themselves, and the reader
// OTEL_METRIC_EXPORT_INTERVAL (default 60s).
func OTLPReader(ctx context.Context, getenv func(string) string) (sdkmetric.Reader, error) {
	if getenv("OTEL_METRICS_EXPORTER") == "none" || getenv("OTEL_SDK_DISABLED") == "true" {
		return nil, nil
	}
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") == "" {
		return nil, nil
	}
	protocol := getenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
	if protocol == "" {
		protocol = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp sdkmetric.Exporter
	var err error
	switch protocol {
	case "", "http/protobuf":
		exp, err = otlpmetrichttp.New(ctx)
	case "grpc":
		exp, err = otlpmetricgrpc.New(ctx)
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q must be http/protobuf or grpc", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("OTLP metric exporter: %w", err)
	}
	return sdkmetric.NewPeriodicReader(exp), nil
}
