package jaegerquery

import (
	"strings"
	"testing"
	"time"
)

// A trace as Jaeger's /api/traces/{id} answers it (v1 JSON, times in µs):
// the application's span, publish, process, two webhook attempts (a 500,
// then a 204 after the retry) and the subscriber's span.
const fixture = `{"data":[{"traceID":"4bf92f3577b34da6a3ce929d0e0e4736","spans":[
 {"spanID":"a1","operationName":"POST /assets/7","processID":"p1","startTime":1000000,"duration":20000,"references":[],"tags":[{"key":"span.kind","value":"server"}]},
 {"spanID":"b1","operationName":"publish assets","processID":"p2","startTime":1050000,"duration":5000,"references":[{"refType":"CHILD_OF","traceID":"4bf92f3577b34da6a3ce929d0e0e4736","spanID":"a1"}],"tags":[{"key":"span.kind","value":"producer"}]},
 {"spanID":"c1","operationName":"process assets","processID":"p3","startTime":1053000,"duration":4000,"references":[{"refType":"CHILD_OF","traceID":"4bf92f3577b34da6a3ce929d0e0e4736","spanID":"b1"}],"tags":[{"key":"span.kind","value":"consumer"}]},
 {"spanID":"d2","operationName":"webhook POST example.com","processID":"p4","startTime":1200000,"duration":3000,"references":[{"refType":"CHILD_OF","traceID":"4bf92f3577b34da6a3ce929d0e0e4736","spanID":"c1"}],"tags":[{"key":"span.kind","value":"client"},{"key":"http.response.status_code","value":204}]},
 {"spanID":"d1","operationName":"webhook POST example.com","processID":"p4","startTime":1100000,"duration":2000,"references":[{"refType":"CHILD_OF","traceID":"4bf92f3577b34da6a3ce929d0e0e4736","spanID":"c1"}],"tags":[{"key":"span.kind","value":"client"},{"key":"http.response.status_code","value":500},{"key":"error","value":true}]},
 {"spanID":"e1","operationName":"POST /hook","processID":"p5","startTime":1201000,"duration":1000,"references":[{"refType":"CHILD_OF","traceID":"4bf92f3577b34da6a3ce929d0e0e4736","spanID":"d2"}],"tags":[{"key":"span.kind","value":"server"}]}
],"processes":{"p1":{"serviceName":"app"},"p2":{"serviceName":"relay"},"p3":{"serviceName":"consume"},"p4":{"serviceName":"deliver"},"p5":{"serviceName":"subscriber"}}}]}`

func TestParseWaterfall(t *testing.T) {
	tr, err := Parse([]byte(fixture))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range tr.Spans {
		names = append(names, strings.Repeat(" ", s.Depth)+s.Name)
	}
	want := []string{"POST /assets/7", " publish assets", "  process assets", "   webhook POST example.com", "   webhook POST example.com", "    POST /hook"}
	if strings.Join(names, "|") != strings.Join(want, "|") {
		t.Fatalf("order:\n%s\nwant\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
	if tr.Spans[3].StatusCode != 500 || !tr.Spans[3].Error || tr.Spans[4].StatusCode != 204 || tr.Spans[4].Error {
		t.Fatalf("attempts: %+v / %+v", tr.Spans[3], tr.Spans[4])
	}
	if tr.Duration != 203*time.Millisecond || tr.Spans[1].Offset != 50*time.Millisecond {
		t.Fatalf("duration %s, publish offset %s", tr.Duration, tr.Spans[1].Offset)
	}
	gaps := map[string]time.Duration{}
	for _, g := range tr.Gaps {
		gaps[g.Name] = g.Duration
	}
	// Outbox: app span ended at 1.020s, publish began at 1.050s. Kafka: the
	// consumer began (1.053s) before publish ended (1.055s), so from its
	// start. Queue: process ended at 1.057s, the first attempt began at 1.100s
	// (the retry at 1.200s waited for its backoff, not in the queue).
	if gaps["in the outbox"] != 30*time.Millisecond || gaps["in Kafka"] != 3*time.Millisecond || gaps["in the delivery queue"] != 43*time.Millisecond || len(tr.Gaps) != 3 {
		t.Fatalf("gaps = %+v", tr.Gaps)
	}
	if !tr.Complete() {
		t.Fatal("a trace with publish, process and a webhook attempt is not Complete")
	}
	text := tr.Text(40)
	for _, want := range []string{"6 spans", "webhook POST example.com 500 ✗ [deliver]", "in the delivery queue", "43ms"} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
	if _, err := Parse([]byte(`{"data":[]}`)); err != ErrNotFound {
		t.Fatalf("empty answer: %v, want ErrNotFound", err)
	}
	if ValidTraceID("00000000000000000000000000000000") || !ValidTraceID("4bf92f3577b34da6a3ce929d0e0e4736") || TraceIDOf("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatal("trace id checks")
	}
}
