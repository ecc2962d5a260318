package delivery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/tracing"
	"github.com/outboxbridge/bridge/internal/version"
)

const (
	// maxResponseRead bounds what is read of an answer: a receiver cannot
	// make the bridge buffer an unbounded body.
	maxResponseRead = 64 << 10
	// maxResponseStored is what the attempt log keeps of it.
	maxResponseStored = 1 << 10
)

// NewHTTPClient returns the client webhook requests go through:
//   - every dialled address is checked against the SSRF block list
//     (dialControl), unless inside allowed;
//   - no proxy from the environment (a proxy would be dialled instead of the
//     destination, and the check would see the proxy's address);
//   - redirects are never followed: a 3xx is the answer, and a failure;
//   - the W3C trace context in the request's context is injected as
//     traceparent/tracestate, and a client span recorded when tp has an SDK;
//   - up to conns idle keep-alive connections per host, the most requests
//     the caller runs at once (its workers): with fewer, every request over
//     the pool's size closed its connection afterwards and the next one
//     dialled a new one (5% of the deliverer's CPU in bench deliver, at 16
//     for 32 workers).
func NewHTTPClient(allowed []netip.Prefix, tp trace.TracerProvider, conns int) *http.Client {
	tp = tracerProvider(tp)
	dialer := &net.Dialer{
		Timeout:   10 * time.Second,
		KeepAlive: 30 * time.Second,
		Control:   dialControl(allowed),
	}
	base := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          max(256, conns),
		MaxIdleConnsPerHost:   max(16, conns),
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		ResponseHeaderTimeout: 0, // the per-attempt context bounds the whole request
	}
	// The propagator is passed explicitly rather than taken from otel's
	// global: the stored traceparent must travel even when no SDK (and no
	// global propagator) is configured.
	rt := otelhttp.NewTransport(attemptSpan{next: base},
		otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return "webhook POST " + r.URL.Host }),
	)
	return &http.Client{
		Transport: rt,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// attemptKey carries the claim into the request's context, so the client
// span of the attempt can say which delivery, subscription and attempt it is.
type attemptKey struct{}

// attemptSpan runs inside otelhttp's transport, where the request's context
// holds the client span otelhttp started: it adds the bridge's attributes to
// it, and marks a 3xx (a failure here: redirects are never followed) as an
// error, which otelhttp does not.
type attemptSpan struct{ next http.RoundTripper }

func (a attemptSpan) RoundTrip(r *http.Request) (*http.Response, error) {
	span := trace.SpanFromContext(r.Context())
	if c, ok := r.Context().Value(attemptKey{}).(*store.Claim); ok && span.IsRecording() {
		span.SetAttributes(
			attribute.Int("webhook.attempt", c.Attempts),
			attribute.String("webhook.subscription_id", c.SubscriptionID),
			attribute.Int64("webhook.delivery_id", c.ID),
			attribute.String("messaging.message.id", c.EventID),
			attribute.String("webhook.event_type", c.EventType),
			attribute.Bool("webhook.revived", c.Revived),
			// Replaces otelhttp's url.full, which keeps the query string:
			// subscribers put tokens there, and traces travel as far as
			// logs.
			attribute.String("url.full", redactURL(c.URL)),
		)
	}
	resp, err := a.next.RoundTrip(r)
	if err == nil && resp.StatusCode >= 300 && resp.StatusCode < 400 {
		span.SetStatus(codes.Error, fmt.Sprintf("HTTP %d: redirects are not followed", resp.StatusCode))
	}
	return resp, err
}

// result is what one HTTP attempt produced.
type result struct {
	status     int
	header     http.Header
	body       []byte // at most maxResponseRead
	err        error
	started    time.Time
	duration   time.Duration
	traceID    string
	retryAfter time.Duration
	hasRA      bool
}

func (r result) success() bool { return r.err == nil && r.status >= 200 && r.status < 300 }

// describe is the attempt's error text for the log ("" on success).
func (r result) describe() string {
	switch {
	case r.err != nil:
		return r.err.Error()
	case r.status >= 300 && r.status < 400:
		loc := r.header.Get("Location")
		if loc != "" {
			loc = redactURL(loc)
		}
		return fmt.Sprintf("HTTP %d redirect to %q not followed (redirects are failures)", r.status, loc)
	case r.status < 200 || r.status >= 300:
		return "HTTP " + strconv.Itoa(r.status) + " " + http.StatusText(r.status)
	}
	return ""
}

// send makes one attempt of claim c, continuing the trace stored with it.
func send(ctx context.Context, client *http.Client, c *store.Claim, timeout time.Duration, now time.Time) result {
	ctx = tracing.ContextWithRemoteParent(ctx, c.Traceparent, c.Tracestate)
	ctx = context.WithValue(ctx, attemptKey{}, c)
	res := result{started: now, traceID: tracing.TraceID(ctx)}
	body, err := contract.NewEnvelope(c.EventID, c.EventType, c.AssetID, c.AssetSeq, c.EventCreatedAt, c.Payload).Marshal()
	if err != nil {
		res.err = err
		return res
	}
	ts := now.Unix()
	if c.SecretsErr != nil {
		res.err = c.SecretsErr
		return res
	}
	if len(c.Secrets) == 0 {
		res.err = errors.New("subscription has no valid signing secret (rotate-secret creates one)")
		return res
	}
	sig, err := Sign(c.Secrets, c.EventID, ts, body)
	if err != nil {
		res.err = err
		return res
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(body))
	if err != nil {
		res.err = fmt.Errorf("build request: %w", err)
		return res
	}
	contract.SetWebhookHeaders(req.Header, c.EventID, ts, sig, version.UserAgent())
	resp, err := client.Do(req)
	if err != nil {
		res.duration = time.Since(now)
		res.err = describeTransportError(err, ctx, timeout)
		return res
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	res.header = resp.Header
	res.body, err = io.ReadAll(io.LimitReader(resp.Body, maxResponseRead))
	res.duration = time.Since(now)
	if err != nil && res.status >= 200 && res.status < 300 {
		// The status line says it arrived; a body cut short does not undo that.
		err = nil
	}
	res.retryAfter, res.hasRA = parseRetryAfter(res.status, resp.Header, time.Now())
	return res
}

func describeTransportError(err error, ctx context.Context, timeout time.Duration) error {
	var be *BlockedAddressError
	if errors.As(err, &be) {
		return be
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("timed out after %s (WEBHOOK_TIMEOUT)", timeout)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		// *url.Error repeats the method and URL; the log has those.
		return ue.Err
	}
	return err
}
