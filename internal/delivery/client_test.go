package delivery

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// The webhook client's own instrumentation replaced otelhttp's transport
// for its cost; what it records must not change (docs/observability.md):
// the same requests — two answered 204, one 500, one refused connection —
// through otelhttp's transport and through ours give the same metrics
// (scope, names, units, descriptions, buckets, attribute sets, counts, body
// sizes) and the same spans (name, kind, attributes, status), and the
// trace context reaches the endpoint from both.
func TestWebhookTransportRecordsWhatOtelhttpDid(t *testing.T) {
	var traceparents []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		traceparents = append(traceparents, r.Header.Get("traceparent"))
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String() + "/gone"
	ln.Close()

	ctx := context.Background()
	run := func(transport func(mp metric.MeterProvider, tp trace.TracerProvider) http.RoundTripper) (metricdata.ResourceMetrics, []sdktrace.ReadOnlySpan, []string) {
		t.Helper()
		traceparents = nil
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		client := &http.Client{Transport: transport(mp, tp)}
		for _, u := range []string{srv.URL + "/ok", srv.URL + "/ok", srv.URL + "/fail", refused} {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(`{"id":"x"}`))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err != nil {
				continue // the refused one
			}
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		return rm, rec.Ended(), slices.Clone(traceparents)
	}
	wantM, wantS, wantTP := run(func(mp metric.MeterProvider, tp trace.TracerProvider) http.RoundTripper {
		return otelhttp.NewTransport(http.DefaultTransport, otelhttp.WithMeterProvider(mp), otelhttp.WithTracerProvider(tp),
			otelhttp.WithPropagators(propagation.TraceContext{}),
			otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return "webhook POST " + r.URL.Host }))
	})
	gotM, gotS, gotTP := run(func(mp metric.MeterProvider, tp trace.TracerProvider) http.RoundTripper {
		return newWebhookTransport(http.DefaultTransport, tp, mp)
	})

	if d := describeMetrics(gotM); d != describeMetrics(wantM) {
		t.Errorf("metrics differ from otelhttp's\n got: %s\nwant: %s", d, describeMetrics(wantM))
	}
	if d := describeSpans(gotS); d != describeSpans(wantS) {
		t.Errorf("spans differ from otelhttp's\n got: %s\nwant: %s", d, describeSpans(wantS))
	}
	if len(gotTP) != 3 || len(wantTP) != 3 {
		t.Fatalf("requests received: %d and %d, want 3 each", len(gotTP), len(wantTP))
	}
	for i, tp := range gotTP {
		if len(tp) != 55 || len(wantTP[i]) != 55 {
			t.Errorf("request %d: traceparent %q (otelhttp: %q), want one injected", i, tp, wantTP[i])
		}
	}
}

// describeMetrics renders what must match: everything but the durations.
func describeMetrics(rm metricdata.ResourceMetrics) string {
	var out []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			head := sm.Scope.Name + " " + sm.Scope.Version + " " + m.Name + " [" + m.Unit + "] " + m.Description
			var points []string
			switch data := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					points = append(points, describeAttrs(p.Attributes)+" count="+itoa(int64(p.Count))+" bounds="+floats(p.Bounds))
				}
			case metricdata.Histogram[int64]:
				for _, p := range data.DataPoints {
					points = append(points, describeAttrs(p.Attributes)+" count="+itoa(int64(p.Count))+" sum="+itoa(p.Sum)+" bounds="+floats(p.Bounds))
				}
			default:
				points = append(points, "unexpected kind")
			}
			slices.Sort(points)
			out = append(out, head+" {"+strings.Join(points, "; ")+"}")
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// describeSpans renders the spans' name, kind, status and attributes;
// url.full is left out (the bridge sets its own, redacted, from the claim).
func describeSpans(spans []sdktrace.ReadOnlySpan) string {
	var out []string
	for _, s := range spans {
		var kvs []attribute.KeyValue
		for _, kv := range s.Attributes() {
			if kv.Key != "url.full" {
				kvs = append(kvs, kv)
			}
		}
		out = append(out, s.Name()+" "+s.SpanKind().String()+" "+s.Status().Code.String()+" "+describeAttrs(attribute.NewSet(kvs...)))
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

func describeAttrs(set attribute.Set) string {
	var parts []string
	for _, kv := range set.ToSlice() {
		parts = append(parts, string(kv.Key)+"="+kv.Value.Emit())
	}
	return strings.Join(parts, ",")
}

func itoa(n int64) string { return attribute.Int64Value(n).Emit() }

func floats(xs []float64) string {
	var parts []string
	for _, x := range xs {
		parts = append(parts, attribute.Float64Value(x).Emit())
	}
	return strings.Join(parts, ",")
}
