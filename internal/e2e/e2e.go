// Package e2e is the whole bridge in one test: a migrated database of its
// own, a broker (kfake or the real one), a webhook receiver with one
// subscription, and the relay, consumer and deliverer running in process,
// each with its own tracer provider and log (as three processes would have).
// Tests that follow one event through every stage (tracing, metrics) build
// on it instead of wiring the stages themselves.
package e2e

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/consumer"
	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/delivery/fastlane"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/logging"
	"github.com/outboxbridge/bridge/internal/metrics"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/relay"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/webhooktest"
	"github.com/outboxbridge/bridge/outbox"
)

// Pipeline is the whole bridge in one test: a database, a broker, a
// webhook receiver with one subscription, and the relay, consumer and
// deliverer, each with a tracer provider of its own (as three processes
// would have).
type Pipeline struct {
	T       *testing.T
	DB      *pgtest.DB
	Brokers []string
	Topic   string
	Recv    *Receiver
	SubID   string // the one subscription: every event type, to Recv

	RelayTP, ConsumerTP, DeliverTP trace.TracerProvider
	// RelayLog and DeliverLog hold the relay's and the deliverer's logs
	// (also written to the test output).
	RelayLog, DeliverLog *testkit.LogBuffer
	Metrics              *metrics.Metrics // nil: none
	OperationsTopic      string
	DisableAfter         int

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	relay  context.CancelFunc // stops the current relay
	relayW *sync.WaitGroup
}

type Config struct {
	Brokers                        []string
	Topic                          string
	RelayTP, ConsumerTP, DeliverTP trace.TracerProvider
	// Metrics, when set, receives the relay's, consumer's and deliverer's
	// series (as `bridge run` would export them).
	Metrics *metrics.Metrics
	// OperationsTopic, when set, is the relay's and the deliverer's
	// BRIDGE_OPERATIONS_TOPIC, and the consumer reads it besides Topic.
	OperationsTopic string
	// DisableAfter is the deliverer's WEBHOOK_DISABLE_AFTER (0: default).
	DisableAfter int
}

// loopback is where the tests' receivers listen: the deliverers' allowed
// destinations.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

func New(t *testing.T, pc Config) *Pipeline {
	t.Helper()
	p := &Pipeline{
		T: t, DB: pgtest.New(t), Brokers: pc.Brokers, Topic: pc.Topic, Recv: NewReceiver(),
		RelayTP: pc.RelayTP, ConsumerTP: pc.ConsumerTP, DeliverTP: pc.DeliverTP,
		RelayLog: &testkit.LogBuffer{}, DeliverLog: &testkit.LogBuffer{}, Metrics: pc.Metrics,
		OperationsTopic: pc.OperationsTopic, DisableAfter: pc.DisableAfter,
	}
	srv := httptest.NewServer(p.Recv)
	t.Cleanup(srv.Close)
	subs := store.NewSubscriptionStore(p.DB.Pool, true, 0)
	url := srv.URL + "/hook"
	sub, err := subs.Create(context.Background(), store.SubscriptionInput{URL: &url, EventTypes: []string{"*"}})
	if err != nil {
		t.Fatalf("create subscription: %v", err)
	}
	p.SubID = sub.ID
	if err := p.Recv.SetSecret("", sub.Secret); err != nil {
		t.Fatalf("receiver secret: %v", err)
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	t.Cleanup(p.Stop)
	return p
}

// logger writes text logs (with trace_id/span_id from ctx) to buf and to
// the test output.
func logger(t *testing.T, buf *testkit.LogBuffer) *slog.Logger {
	return logging.New(io.MultiWriter(buf, t.Output()), "info", "text")
}

// StartRelay starts a relay with maxMessageBytes (0: default); StopRelay
// stops it and waits.
func (p *Pipeline) StartRelay(maxMessageBytes int) {
	p.T.Helper()
	cfg := relay.Config{
		Logger:          logger(p.T, p.RelayLog),
		TracerProvider:  p.RelayTP,
		PollInterval:    50 * time.Millisecond,
		BackoffBase:     50 * time.Millisecond,
		BackoffMax:      500 * time.Millisecond,
		LeaseTimeout:    2 * time.Second,
		ProduceTimeout:  5 * time.Second,
		MaxMessageBytes: maxMessageBytes,
		OperationsTopic: p.OperationsTopic,
	}
	if p.Metrics != nil {
		cfg.Metrics = p.Metrics.Relay()
	}
	client, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(p.Brokers...)}, relay.ProducerOptions(cfg)...)...)
	if err != nil {
		p.T.Fatalf("relay client: %v", err)
	}
	ctx, cancel := context.WithCancel(p.ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer client.Close()
		if err := relay.New(p.DB.Pool, client, cfg).Run(ctx); err != nil {
			p.T.Errorf("relay.Run: %v", err)
		}
	})
	p.relay, p.relayW = cancel, &wg
}

func (p *Pipeline) StopRelay() {
	if p.relay != nil {
		p.relay()
		p.relayW.Wait()
		p.relay = nil
	}
}

// StartConsumerAndDeliverer starts the other two processes.
func (p *Pipeline) StartConsumerAndDeliverer() {
	p.T.Helper()
	c, err := consumer.New(p.DB.Pool, []kgo.Opt{kgo.SeedBrokers(p.Brokers...)}, consumer.Config{
		Group:          "g-" + p.Topic,
		Topics:         p.topics(),
		Logger:         logging.New(p.T.Output(), "info", "text"),
		TracerProvider: p.ConsumerTP,
		RetryBackoff:   20 * time.Millisecond,
	})
	if err != nil {
		p.T.Fatalf("consumer.New: %v", err)
	}
	var hook delivery.Metrics
	if p.Metrics != nil {
		hook = p.Metrics.Deliveries()
		for _, observe := range []func() (func() error, error){
			func() (func() error, error) { return p.Metrics.ObserveConsumer(c, "g-"+p.Topic) },
			func() (func() error, error) { return p.Metrics.ObserveOutbox(p.DB.Pool) },
			func() (func() error, error) { return p.Metrics.ObserveDeliveries(p.DB.Pool) },
		} {
			unregister, err := observe()
			if err != nil {
				p.T.Fatal(err)
			}
			p.T.Cleanup(func() { _ = unregister() })
		}
	}
	p.run("consumer.Run", c.Run)
	p.startDeliverer(hook)
}

// startDeliverer starts the deliverer that posts bridge.deliveries' rows:
// the row engine's, or the fast lane's slow lane. One attempt: a failure is
// dead at once.
func (p *Pipeline) startDeliverer(hook delivery.Metrics) {
	p.T.Helper()
	d, err := delivery.NewDeliverer(p.DB.Pool, delivery.Config{
		Metrics:        hook,
		RetrySchedule:  []time.Duration{},
		PollInterval:   50 * time.Millisecond,
		AllowedCIDRs:   loopback,
		TracerProvider: p.DeliverTP,
		Logger:         logger(p.T, p.DeliverLog),
		Timeout:        5 * time.Second,

		OperationsTopic: p.OperationsTopic,
		DisableAfter:    p.DisableAfter,
	})
	if err != nil {
		p.T.Fatalf("delivery.NewDeliverer: %v", err)
	}
	p.run("deliverer.Run", d.Run)
}

// run runs fn until the pipeline stops; an error fails the test.
func (p *Pipeline) run(name string, fn func(context.Context) error) {
	p.wg.Go(func() {
		if err := fn(p.ctx); err != nil {
			p.T.Errorf("%s: %v", name, err)
		}
	})
}

// topics are what the consumer group reads: the topic, and the operations
// topic when there is one.
func (p *Pipeline) topics() []string {
	if p.OperationsTopic == "" {
		return []string{p.Topic}
	}
	return []string{p.Topic, p.OperationsTopic}
}

// StartFastLane starts the deliverer as `bridge deliver` runs it by default
// (WEBHOOK_FAST_LANE): a fast-lane member of the topic's group posting from
// memory, beside the slow lane serving the streams it parks. It replaces
// StartConsumerAndDeliverer.
func (p *Pipeline) StartFastLane() {
	p.T.Helper()
	l, err := fastlane.New(p.DB.Pool, []kgo.Opt{kgo.SeedBrokers(p.Brokers...)}, fastlane.Config{
		Group:          "g-" + p.Topic,
		Topics:         p.topics(),
		AllowedCIDRs:   loopback,
		RetrySchedule:  []time.Duration{}, // one attempt: a failure is dead at once
		Timeout:        5 * time.Second,
		TracerProvider: p.DeliverTP,
		Logger:         logger(p.T, p.DeliverLog),
	})
	if err != nil {
		p.T.Fatalf("fastlane.New: %v", err)
	}
	p.run("fastlane.Run", l.Run)
	p.startDeliverer(nil)
}

func (p *Pipeline) Stop() {
	p.StopRelay()
	p.cancel()
	p.wg.Wait()
}

// Enqueue writes one event in its own transaction under ctx (the
// application's span) and returns its dedup id.
func (p *Pipeline) Enqueue(ctx context.Context, asset string, payload string) string {
	p.T.Helper()
	var id uuid.UUID
	err := pgx.BeginFunc(ctx, p.DB.Pool, func(tx pgx.Tx) error {
		var err error
		id, err = outbox.Enqueue(ctx, tx, outbox.Event{Topic: p.Topic, AssetID: asset, EventType: "asset.updated", Payload: json.RawMessage(payload)})
		return err
	})
	if err != nil {
		p.T.Fatalf("enqueue: %v", err)
	}
	return id.String()
}

// OutboxStatus returns a row's status.
func (p *Pipeline) OutboxStatus(id string) string {
	var s string
	if err := p.DB.Pool.QueryRow(context.Background(), `SELECT status FROM bridge.outbox WHERE id = $1`, id).Scan(&s); err != nil {
		p.T.Fatalf("outbox status: %v", err)
	}
	return s
}

// Receiver is the subscriber: internal/webhooktest's receiver (signatures,
// dedup, order, overlaps) that also records the traceparent of every request
// by webhook-id, and answers 500 to the ids in fail.
type Receiver struct {
	*webhooktest.Receiver
	mu   sync.Mutex
	got  map[string][]string // webhook-id → traceparents, one per attempt
	fail map[string]bool
}

func NewReceiver() *Receiver {
	r := &Receiver{Receiver: webhooktest.New(), got: map[string][]string{}, fail: map[string]bool{}}
	r.Respond = func(q *webhooktest.Request) (int, time.Duration) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.fail[q.WebhookID] {
			return http.StatusInternalServerError, 0
		}
		return http.StatusNoContent, 0
	}
	r.Observe = func(q *webhooktest.Request) {
		r.mu.Lock()
		r.got[q.WebhookID] = append(r.got[q.WebhookID], q.Traceparent)
		r.mu.Unlock()
	}
	return r
}

func (r *Receiver) FailFor(id string) {
	r.mu.Lock()
	r.fail[id] = true
	r.mu.Unlock()
}

// Traceparents returns what the receiver got for id.
func (r *Receiver) Traceparents(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got[id]...)
}
