package delivery

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/testkit"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func spanAttr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// Each HTTP attempt's client span says which attempt of which delivery and
// subscription it is and fails on an error answer; a dead delivery leaves a
// delivery.dead event in its trace; a revived delivery's span says so.
func TestAttemptSpansCarryAttemptSubscriptionDeadAndRevived(t *testing.T) {
	b := setup(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	var healthy atomic.Bool
	_, sub := b.endpoint(t, func(*received, int) int {
		if healthy.Load() {
			return http.StatusOK
		}
		return http.StatusInternalServerError
	})
	b.runDeliverer(t, Config{RetrySchedule: []time.Duration{0}, TracerProvider: tp})
	id := b.insert(t, sub.ID, "x", 1, `{}`)
	b.waitStatus(t, id, store.StatusDead)
	// The dead span ends just after the outcome commits: wait for it, not
	// only for the row.
	testkit.Eventually(t, waitLong, func() string {
		for _, s := range rec.Ended() {
			if s.Name() == "webhook dead" {
				return ""
			}
		}
		return "the dead delivery's span to end"
	})

	var clients, dead []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "webhook dead":
			dead = append(dead, s)
		default:
			if _, ok := spanAttr(s, "webhook.attempt"); ok {
				clients = append(clients, s)
			}
		}
	}
	if len(clients) != 2 {
		t.Fatalf("%d client spans with webhook.attempt, want 2 (one per attempt)", len(clients))
	}
	for i, s := range clients {
		if v, _ := spanAttr(s, "webhook.attempt"); v.AsInt64() != int64(i+1) {
			t.Errorf("span %d: webhook.attempt = %d", i, v.AsInt64())
		}
		if v, _ := spanAttr(s, "webhook.subscription_id"); v.AsString() != sub.ID {
			t.Errorf("span %d: webhook.subscription_id = %q, want %q", i, v.AsString(), sub.ID)
		}
		if s.Status().Code != codes.Error {
			t.Errorf("span %d for an HTTP 500: status %v, want Error", i, s.Status().Code)
		}
		if v, _ := spanAttr(s, "webhook.revived"); v.AsBool() {
			t.Errorf("span %d: revived before any revive", i)
		}
	}
	if len(dead) != 1 || len(dead[0].Events()) != 1 || dead[0].Events()[0].Name != "delivery.dead" {
		t.Fatalf("dead delivery spans: %d, want one with a delivery.dead event", len(dead))
	}
	if dead[0].SpanContext().TraceID() != clients[0].SpanContext().TraceID() {
		t.Fatal("the dead span is not in the delivery's trace")
	}

	healthy.Store(true)
	if _, _, err := b.store.Revive(context.Background(), []int64{id}); err != nil {
		t.Fatal(err)
	}
	b.waitStatus(t, id, store.StatusDelivered)
	var revived []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if v, ok := spanAttr(s, "webhook.revived"); ok && v.AsBool() {
			revived = append(revived, s)
		}
	}
	if len(revived) != 1 || revived[0].Status().Code == codes.Error {
		t.Fatalf("revived attempt spans: %d, want 1 successful", len(revived))
	}
	if revived[0].SpanContext().TraceID() != clients[0].SpanContext().TraceID() {
		t.Fatal("the revived attempt left the original trace")
	}
}

// A token in a subscription URL's query string reaches neither the log nor
// the attempt's span: both show scheme, host and path only.
func TestURLQueryNeverReachesLogsOrSpans(t *testing.T) {
	const token = "SUBSCRIBER-TOKEN-91c2"
	b := setup(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	var logs testkit.LogBuffer
	rc := newReceiver(t, func(*received, int) int { return http.StatusInternalServerError })
	sub := b.createSub(t, rc.URL+"/hooks/in?token="+token)
	b.runDeliverer(t, Config{RetrySchedule: []time.Duration{0}, TracerProvider: tp,
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	id := b.insert(t, sub.ID, "x", 1, `{}`)
	b.waitStatus(t, id, store.StatusDead)

	want := rc.URL + "/hooks/in"
	sawURL := false
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(line, token) {
			t.Errorf("log line shows the URL's token: %s", line)
		}
		var l struct{ URL string }
		if json.Unmarshal([]byte(line), &l) == nil && l.URL != "" {
			sawURL = true
			if l.URL != want {
				t.Errorf("log url = %q, want %q", l.URL, want)
			}
		}
	}
	if !sawURL {
		t.Errorf("no log line names the URL:\n%s", logs.String())
	}
	clients := 0
	for _, s := range rec.Ended() {
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.Emit(), token) {
				t.Errorf("span %q attribute %s shows the URL's token: %s", s.Name(), kv.Key, kv.Value.Emit())
			}
		}
		if v, ok := spanAttr(s, "url.full"); ok {
			clients++
			if v.AsString() != want {
				t.Errorf("span url.full = %q, want %q", v.AsString(), want)
			}
		}
	}
	if clients == 0 {
		t.Error("no span with url.full")
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://h.example/p/a?token=x#frag":  "https://h.example/p/a",
		"https://u:pw@h.example:8443/p?":      "https://h.example:8443/p",
		"http://h.example":                    "http://h.example",
		"https://h.example/p;param?x=1&y=2":   "https://h.example/p;param",
		"https://h.example/%7Euser?sig=abc":   "https://h.example/%7Euser",
		"mailto:someone@example.com?subject=": "mailto:",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
