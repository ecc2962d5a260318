package delivery

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/httpconv"
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
//   - the HTTP client metrics (http.client.request.duration and
//     http.client.request.body.size, docs/observability.md) are recorded into
//     otel's global meter provider;
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
	return &http.Client{
		Transport: newWebhookTransport(base, tp, otel.GetMeterProvider()),
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// webhookTransport is the client's instrumentation: the CLIENT span of each
// attempt, the trace context in its headers and the HTTP client metrics.
//
// It replaces otelhttp's transport, which did the same at ~7% of the
// deliverer process's CPU in bench pipeline (3,000 requests/s): per request
// it cloned the request, built the span's attributes even for a no-op tracer,
// and built and sorted a new attribute set for its metrics. Here the span's
// attributes are built only for a recording span, and the metrics'
// attribute sets are made once per (server, status) and kept. The span name
// and attributes, the metric names, units, buckets, attributes and scope
// are otelhttp's (docs/observability.md), so dashboards and traces do not
// change.
type webhookTransport struct {
	next        http.RoundTripper
	tracer      trace.Tracer
	propagator  propagation.TextMapPropagator
	duration    metric.Float64Histogram
	bodySize    metric.Int64Histogram
	metricAttrs sync.Map // metricKey → metric.MeasurementOption
}

// otelhttpScope is the instrumentation scope the client metrics and spans
// were recorded under by otelhttp, kept so their series do not change.
const otelhttpScope = "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

func newWebhookTransport(next http.RoundTripper, tp trace.TracerProvider, mp metric.MeterProvider) *webhookTransport {
	t := &webhookTransport{
		next:   next,
		tracer: tp.Tracer(otelhttpScope, trace.WithInstrumentationVersion(otelhttp.Version)),
		// Passed explicitly rather than taken from otel's global: the
		// stored traceparent must travel even when no SDK (and no global
		// propagator) is configured.
		propagator: propagation.TraceContext{},
	}
	meter := mp.Meter(otelhttpScope, metric.WithInstrumentationVersion(otelhttp.Version))
	// Instrument errors leave a no-op instrument: metrics must not stop
	// deliveries.
	duration, err := httpconv.NewClientRequestDuration(meter,
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
	if err != nil {
		otel.Handle(err)
	}
	bodySize, err := httpconv.NewClientRequestBodySize(meter)
	if err != nil {
		otel.Handle(err)
	}
	t.duration, t.bodySize = duration.Inst(), bodySize.Inst()
	if t.duration == nil {
		t.duration = metricnoop.Float64Histogram{}
	}
	if t.bodySize == nil {
		t.bodySize = metricnoop.Int64Histogram{}
	}
	return t
}

// metricKey is what a request's metric attributes depend on.
type metricKey struct {
	scheme, host, proto, errType string
	port, status                 int
}

func (t *webhookTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	host, port := splitHostPort(r.URL.Host)
	ctx, span := t.tracer.Start(r.Context(), "webhook POST "+r.URL.Host, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(requestSpanAttrs(r, host, port)...)
		if c, ok := ctx.Value(attemptKey{}).(*store.Claim); ok {
			span.SetAttributes(
				attribute.Int("webhook.attempt", c.Attempts),
				attribute.String("webhook.subscription_id", c.SubscriptionID),
				attribute.Int64("webhook.delivery_id", c.ID),
				attribute.String("messaging.message.id", c.EventID),
				attribute.String("webhook.event_type", c.EventType),
				attribute.Bool("webhook.revived", c.Revived),
				// Replaces the full URL, which keeps the query string:
				// subscribers put tokens there, and traces travel as far
				// as logs.
				attribute.String("url.full", redactURL(c.URL)),
			)
		}
	}
	// A RoundTripper must not modify the request: the trace context goes
	// into a copy of its headers. Without a valid span context there is
	// nothing to inject, and the headers are sent as they are.
	out := r.WithContext(ctx)
	if trace.SpanContextFromContext(ctx).IsValid() {
		out.Header = r.Header.Clone()
		t.propagator.Inject(ctx, propagation.HeaderCarrier(out.Header))
	}

	resp, err := t.next.RoundTrip(out)
	elapsed := time.Since(start)
	key := metricKey{scheme: r.URL.Scheme, host: host, proto: r.Proto, port: port}
	if err == nil {
		key.status = resp.StatusCode
		if resp.Proto != "" {
			key.proto = resp.Proto
		}
	} else {
		key.errType = errorType(err)
	}
	opt := t.metricOption(key)
	t.duration.Record(ctx, float64(elapsed)/float64(time.Second), opt)
	// The body's size once it went out: otelhttp counted the bytes the
	// transport read, which is the whole body when an answer came (the
	// bridge's bodies have a known length) and none when the connection
	// failed before the request was written.
	sent := max(r.ContentLength, 0)
	if err != nil {
		sent = 0
	}
	t.bodySize.Record(ctx, sent, opt)

	if err != nil {
		if span.IsRecording() {
			span.SetAttributes(semconv.ErrorType(err))
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		return resp, err
	}
	if span.IsRecording() {
		span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
		if resp.StatusCode >= 400 || resp.StatusCode < 100 {
			span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(resp.StatusCode)))
		}
		if _, v := netProtocol(resp.Proto); v != "" {
			span.SetAttributes(semconv.NetworkProtocolVersion(v))
		}
		switch {
		case resp.StatusCode < 100 || resp.StatusCode >= 600:
			span.SetStatus(codes.Error, fmt.Sprintf("Invalid HTTP status code %d", resp.StatusCode))
		case resp.StatusCode >= 400:
			span.SetStatus(codes.Error, "")
		case resp.StatusCode >= 300:
			// A failure here: redirects are never followed.
			span.SetStatus(codes.Error, fmt.Sprintf("HTTP %d: redirects are not followed", resp.StatusCode))
		}
	}
	// The span ends when the answer has been read (or closed unread).
	resp.Body = &spanBody{ReadCloser: resp.Body, span: span}
	return resp, nil
}

// metricOption is the metrics' attribute set for key, made once.
func (t *webhookTransport) metricOption(key metricKey) metric.MeasurementOption {
	if o, ok := t.metricAttrs.Load(key); ok {
		return o.(metric.MeasurementOption)
	}
	name, version := netProtocol(key.proto)
	attrs := []attribute.KeyValue{
		semconv.HTTPRequestMethodPost,
		semconv.ServerAddress(key.host),
		semconv.URLScheme(cmp.Or(key.scheme, "http")),
	}
	if p := requiredPort(key.scheme == "https", key.port); p > 0 {
		attrs = append(attrs, semconv.ServerPort(p))
	}
	if name != "" {
		attrs = append(attrs, semconv.NetworkProtocolName(name))
	}
	if version != "" {
		attrs = append(attrs, semconv.NetworkProtocolVersion(version))
	}
	if key.status > 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(key.status))
	} else if key.errType != "" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(key.errType))
	}
	o, _ := t.metricAttrs.LoadOrStore(key, metric.WithAttributeSet(attribute.NewSet(attrs...)))
	return o.(metric.MeasurementOption)
}

// requestSpanAttrs are the span attributes known before the request goes
// out (url.full is the bridge's redacted one, set by RoundTrip).
func requestSpanAttrs(r *http.Request, host string, port int) []attribute.KeyValue {
	attrs := []attribute.KeyValue{semconv.HTTPRequestMethodPost, semconv.ServerAddress(host)}
	if p := requiredPort(r.URL.Scheme == "https", port); p > 0 {
		attrs = append(attrs, semconv.ServerPort(p))
	}
	if _, v := netProtocol(r.Proto); v != "" {
		attrs = append(attrs, semconv.NetworkProtocolVersion(v))
	}
	return attrs
}

// splitHostPort splits a URL's host[:port] (port -1 when absent).
func splitHostPort(hostport string) (string, int) {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return strings.Trim(hostport, "[]"), -1
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return host, -1
	}
	return host, port
}

// requiredPort is the port the semantic conventions ask to be recorded:
// only one that is not the scheme's default.
func requiredPort(https bool, port int) int {
	if port <= 0 || (https && port == 443) || (!https && port == 80) {
		return -1
	}
	return port
}

// netProtocol splits "HTTP/1.1" into "http" and "1.1".
func netProtocol(proto string) (name, version string) {
	name, version, _ = strings.Cut(proto, "/")
	return strings.ToLower(name), version
}

// errorType is the error.type of a transport error: the error's type name,
// a value of low cardinality.
func errorType(err error) string {
	t := reflect.TypeOf(err)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.PkgPath() == "" || t.Name() == "" {
		return t.String()
	}
	return t.PkgPath() + "." + t.Name()
}

// spanBody ends the attempt's span once the answer is read to its end or
// closed.
type spanBody struct {
	io.ReadCloser
	span trace.Span
	once sync.Once
}

func (b *spanBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.end()
	}
	return n, err
}

func (b *spanBody) Close() error {
	err := b.ReadCloser.Close()
	b.end()
	return err
}

func (b *spanBody) end() { b.once.Do(func() { b.span.End() }) }

// attemptKey carries the claim into the request's context, so the client
// span of the attempt can say which delivery, subscription and attempt it is.
type attemptKey struct{}

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
	req, err := newPost(ctx, c.URL, body)
	if err != nil {
		res.err = fmt.Errorf("build request: %w", err)
		return res
	}
	contract.SetWebhookHeaders(req.Header, c.EventID, ts, sig, version.UserAgent())
	resp, err := roundTrip(client, req)
	if err != nil {
		res.duration = time.Since(now)
		res.err = describeTransportError(err, ctx, timeout)
		return res
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	res.header = resp.Header
	if resp.ContentLength != 0 {
		// An answer with no body (204, or Content-Length: 0) allocates
		// nothing to read it.
		res.body, err = io.ReadAll(io.LimitReader(resp.Body, maxResponseRead))
	}
	res.duration = time.Since(now)
	if err != nil && res.status >= 200 && res.status < 300 {
		// The status line says it arrived; a body cut short does not undo that.
		err = nil
	}
	res.retryAfter, res.hasRA = parseRetryAfter(res.status, resp.Header, time.Now())
	return res
}

// roundTrip sends req through client's transport. A webhook never follows
// a redirect (a 3xx is the attempt's answer, a failure), sends no cookies
// and is bounded by its context, so the http.Client layer — which copies
// every request's headers for redirects it will not follow — is skipped.
func roundTrip(client *http.Client, req *http.Request) (*http.Response, error) {
	rt := client.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	resp, err := rt.RoundTrip(req)
	if err == nil && resp == nil {
		return nil, errors.New("http: RoundTripper returned a nil response with a nil error")
	}
	return resp, err
}

// newPost is http.NewRequestWithContext(ctx, POST, rawURL, body) with the
// URL parsed once per endpoint (parsedURLs) rather than per request. The
// parsed URL is shared by the requests and never modified.
func newPost(ctx context.Context, rawURL string, body []byte) (*http.Request, error) {
	u, host, err := parsedURL(rawURL)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "", nil)
	if err != nil {
		return nil, err
	}
	req.URL, req.Host = u, host
	req.ContentLength = int64(len(body))
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if len(body) == 0 {
		req.Body, req.GetBody = http.NoBody, func() (io.ReadCloser, error) { return http.NoBody, nil }
	}
	return req, nil
}

// parsedURLs caches endpoints' parsed URLs; past maxParsedURLs it starts
// again empty, so URLs of deleted subscriptions do not accumulate.
var parsedURLs struct {
	sync.Mutex
	m map[string]*http.Request // only URL and Host are kept
}

const maxParsedURLs = 4096

// parsedURL parses rawURL as http.NewRequest does, once: its URL and Host.
func parsedURL(rawURL string) (*url.URL, string, error) {
	parsedURLs.Lock()
	r := parsedURLs.m[rawURL]
	parsedURLs.Unlock()
	if r != nil {
		return r.URL, r.Host, nil
	}
	r, err := http.NewRequest(http.MethodPost, rawURL, nil)
	if err != nil {
		return nil, "", err
	}
	r = &http.Request{URL: r.URL, Host: r.Host}
	parsedURLs.Lock()
	if parsedURLs.m == nil || len(parsedURLs.m) >= maxParsedURLs {
		parsedURLs.m = map[string]*http.Request{}
	}
	parsedURLs.m[rawURL] = r
	parsedURLs.Unlock()
	return r.URL, r.Host, nil
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
