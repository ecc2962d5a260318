package metrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// With an OTLP endpoint configured, the bridge's metrics are pushed to
// <endpoint>/v1/metrics as well as served on /metrics.
func TestOTLPReaderPushesMetrics(t *testing.T) {
	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/metrics" && r.Header.Get("Content-Type") == "application/x-protobuf" {
			posts.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL}
	reader, err := OTLPReader(context.Background(), func(k string) string { return env[k] })
	if err != nil || reader == nil {
		t.Fatalf("OTLPReader = %v, %v", reader, err)
	}
	m, err := New(Options{Readers: []sdkmetric.Reader{reader}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown(context.Background()) //nolint:errcheck
	m.Relay().Produced("assets", 5*time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for posts.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no OTLP metrics export arrived within 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestOTLPReaderOffWithoutEndpointOrWhenNone(t *testing.T) {
	for _, env := range []map[string]string{
		{},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_METRICS_EXPORTER": "none"},
	} {
		r, err := OTLPReader(context.Background(), func(k string) string { return env[k] })
		if err != nil || r != nil {
			t.Fatalf("env %v: reader %v, err %v; want none", env, r, err)
		}
	}
	if _, err := OTLPReader(context.Background(), func(k string) string {
		return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}[k]
	}); err == nil {
		t.Fatal("a bad protocol was accepted")
	}
}
