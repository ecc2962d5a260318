package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/consumer"
	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/logging"
	"github.com/outboxbridge/bridge/internal/metrics"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/relay"
	"github.com/outboxbridge/bridge/outbox"
)

// pipeline is the whole bridge in one test: a database, a broker, a
// webhook receiver with one subscription, and the relay, consumer and
// deliverer, each with a tracer provider of its own (as three processes
// would have).
type pipeline struct {
	t       *testing.T
	db      *pgtest.DB
	brokers []string
	topic   string
	recv    *receiver
	subID   string

	relayTP, consumerTP, deliverTP trace.TracerProvider
	relayLog, deliverLog           *lockedBuffer
	metrics                        *metrics.Metrics // nil: none

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	relay  context.CancelFunc // stops the current relay
	relayW *sync.WaitGroup
}

type pipelineConfig struct {
	brokers                        []string
	topic                          string
	relayTP, consumerTP, deliverTP trace.TracerProvider
	// metrics, when set, receives the relay's, consumer's and deliverer's
	// series (as `bridge run` would export them).
	metrics *metrics.Metrics
}

func newPipeline(t *testing.T, pc pipelineConfig) *pipeline {
	t.Helper()
	p := &pipeline{
		t: t, db: pgtest.New(t), brokers: pc.brokers, topic: pc.topic, recv: newReceiver(),
		relayTP: pc.relayTP, consumerTP: pc.consumerTP, deliverTP: pc.deliverTP,
		relayLog: &lockedBuffer{}, deliverLog: &lockedBuffer{}, metrics: pc.metrics,
	}
	srv := httptest.NewServer(p.recv)
	t.Cleanup(srv.Close)
	subs := store.NewSubscriptionStore(p.db.Pool, true, 0)
	url := srv.URL + "/hook"
	sub, err := subs.Create(context.Background(), store.SubscriptionInput{URL: &url, EventTypes: []string{"*"}})
	if err != nil {
		t.Fatalf("create subscription: %v", err)
	}
	p.subID = sub.ID
	p.ctx, p.cancel = context.WithCancel(context.Background())
	t.Cleanup(p.stop)
	return p
}

// logger writes text logs (with trace_id/span_id from ctx) to buf and to
// the test output.
func logger(t *testing.T, buf *lockedBuffer) *slog.Logger {
	return logging.New(io.MultiWriter(buf, t.Output()), "info", "text")
}

// startRelay starts a relay with maxMessageBytes (0: default); stopRelay
// stops it and waits.
func (p *pipeline) startRelay(maxMessageBytes int) {
	p.t.Helper()
	cfg := relay.Config{
		Logger:          logger(p.t, p.relayLog),
		TracerProvider:  p.relayTP,
		PollInterval:    50 * time.Millisecond,
		BackoffBase:     50 * time.Millisecond,
		BackoffMax:      500 * time.Millisecond,
		LeaseTimeout:    2 * time.Second,
		ProduceTimeout:  5 * time.Second,
		MaxMessageBytes: maxMessageBytes,
	}
	if p.metrics != nil {
		cfg.Metrics = p.metrics.Relay()
	}
	client, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(p.brokers...)}, relay.ProducerOptions(cfg)...)...)
	if err != nil {
		p.t.Fatalf("relay client: %v", err)
	}
	ctx, cancel := context.WithCancel(p.ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer client.Close()
		if err := relay.New(p.db.Pool, client, cfg).Run(ctx); err != nil {
			p.t.Errorf("relay.Run: %v", err)
		}
	})
	p.relay, p.relayW = cancel, &wg
}

func (p *pipeline) stopRelay() {
	if p.relay != nil {
		p.relay()
		p.relayW.Wait()
		p.relay = nil
	}
}

// startConsumerAndDeliverer starts the other two processes.
func (p *pipeline) startConsumerAndDeliverer() {
	p.t.Helper()
	c, err := consumer.New(p.db.Pool, []kgo.Opt{kgo.SeedBrokers(p.brokers...)}, consumer.Config{
		Group:          "g-" + p.topic,
		Topics:         []string{p.topic},
		Logger:         logging.New(p.t.Output(), "info", "text"),
		TracerProvider: p.consumerTP,
		RetryBackoff:   20 * time.Millisecond,
	})
	if err != nil {
		p.t.Fatalf("consumer.New: %v", err)
	}
	var hook delivery.Metrics
	if p.metrics != nil {
		hook = p.metrics.Deliveries()
		for _, observe := range []func() (func() error, error){
			func() (func() error, error) { return p.metrics.ObserveConsumer(c, "g-"+p.topic) },
			func() (func() error, error) { return p.metrics.ObserveOutbox(p.db.Pool) },
			func() (func() error, error) { return p.metrics.ObserveDeliveries(p.db.Pool) },
		} {
			unregister, err := observe()
			if err != nil {
				p.t.Fatal(err)
			}
			p.t.Cleanup(func() { _ = unregister() })
		}
	}
	d, err := delivery.NewDeliverer(p.db.Pool, delivery.Config{
		Metrics:        hook,
		RetrySchedule:  []time.Duration{}, // one attempt: a failure is dead at once
		PollInterval:   50 * time.Millisecond,
		AllowedCIDRs:   []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		TracerProvider: p.deliverTP,
		Logger:         logger(p.t, p.deliverLog),
		Timeout:        5 * time.Second,
	})
	if err != nil {
		p.t.Fatalf("delivery.NewDeliverer: %v", err)
	}
	p.wg.Go(func() {
		if err := c.Run(p.ctx); err != nil {
			p.t.Errorf("consumer.Run: %v", err)
		}
	})
	p.wg.Go(func() {
		if err := d.Run(p.ctx); err != nil {
			p.t.Errorf("deliverer.Run: %v", err)
		}
	})
}

func (p *pipeline) stop() {
	p.stopRelay()
	p.cancel()
	p.wg.Wait()
}

// enqueue writes one event in its own transaction under ctx (the
// application's span) and returns its dedup id.
func (p *pipeline) enqueue(ctx context.Context, asset string, payload string) string {
	p.t.Helper()
	var id uuid.UUID
	err := pgx.BeginFunc(ctx, p.db.Pool, func(tx pgx.Tx) error {
		var err error
		id, err = outbox.Enqueue(ctx, tx, outbox.Event{Topic: p.topic, AssetID: asset, EventType: "asset.updated", Payload: json.RawMessage(payload)})
		return err
	})
	if err != nil {
		p.t.Fatalf("enqueue: %v", err)
	}
	return id.String()
}

// waitFor polls cond until it returns "" (or fails the test with its last
// complaint after timeout).
func waitFor(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// outboxStatus returns a row's status.
func (p *pipeline) outboxStatus(id string) string {
	var s string
	if err := p.db.Pool.QueryRow(context.Background(), `SELECT status FROM bridge.outbox WHERE id = $1`, id).Scan(&s); err != nil {
		p.t.Fatalf("outbox status: %v", err)
	}
	return s
}

// receiver is the subscriber: it records the traceparent of every request
// by webhook-id, and answers 500 to the ids in fail.
type receiver struct {
	mu   sync.Mutex
	got  map[string][]string // webhook-id → traceparents, one per attempt
	fail map[string]bool
}

func newReceiver() *receiver {
	return &receiver{got: map[string][]string{}, fail: map[string]bool{}}
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	_, _ = io.Copy(io.Discard, req.Body)
	id := req.Header.Get("webhook-id")
	r.mu.Lock()
	r.got[id] = append(r.got[id], req.Header.Get("traceparent"))
	fail := r.fail[id]
	r.mu.Unlock()
	if fail {
		http.Error(w, "handler broke", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) failFor(id string) {
	r.mu.Lock()
	r.fail[id] = true
	r.mu.Unlock()
}

// traceparents returns what the receiver got for id.
func (r *receiver) traceparents(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got[id]...)
}

// parseTraceparent splits a W3C traceparent into trace id and parent id.
func parseTraceparent(t *testing.T, tp string) (traceID, parentID string) {
	t.Helper()
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || len(parts[1]) != 32 || len(parts[2]) != 16 {
		t.Fatalf("traceparent %q is not W3C", tp)
	}
	return parts[1], parts[2]
}

// lockedBuffer is an io.Writer several goroutines log into.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lineWith returns the first line containing every one of subs.
func (b *lockedBuffer) lineWith(subs ...string) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
next:
	for line := range strings.SplitSeq(b.buf.String(), "\n") {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		return line, true
	}
	return "", false
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func uuids(t *testing.T, ids ...string) []uuid.UUID {
	t.Helper()
	out := make([]uuid.UUID, len(ids))
	for i, s := range ids {
		out[i] = uuid.MustParse(s)
	}
	return out
}
