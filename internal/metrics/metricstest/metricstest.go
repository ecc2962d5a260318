// Package metricstest reads a Prometheus /metrics answer in tests.
package metricstest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families is one scrape, by metric family name.
type Families map[string]*dto.MetricFamily

// Scrape serves GET /metrics from h.
func Scrape(t testing.TB, h http.Handler) Families {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	return Parse(t, rec.Body)
}

// ScrapeURL fetches url (a real server's /metrics).
func ScrapeURL(t testing.TB, url string) Families {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	return Parse(t, resp.Body)
}

// Parse reads the text exposition format.
func Parse(t testing.TB, r io.Reader) Families {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// Value returns the value of the series of family name whose labels include
// every pair of labels: a gauge's or counter's value, a histogram's sample
// count. ok is false when there is no such series.
func (f Families) Value(name string, labels map[string]string) (v float64, ok bool) {
	fam := f[name]
	if fam == nil {
		return 0, false
	}
next:
	for _, m := range fam.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		for k, want := range labels {
			if have[k] != want {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// Has reports whether family name exists.
func (f Families) Has(name string) bool { return f[name] != nil }
