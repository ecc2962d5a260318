package fastlane

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/logging"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/webhooktest"
)

var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

// world is one test's: its own database, a fresh topic on the real broker, a
// group nobody else uses, a receiver that checks signatures, order and
// overlaps, and the subscriptions that post to it.
type world struct {
	db       *pgtest.DB
	brokers  []string
	topic    string
	group    string
	producer *kgo.Client
	recv     *webhooktest.Receiver
	srv      *httptest.Server
	subs     []*store.Subscription
	paths    []string
	seq      map[string]int64 // asset → last asset_seq produced
}

func newWorld(t *testing.T, partitions int32, subs int) *world {
	t.Helper()
	t.Parallel()
	w := &world{db: pgtest.New(t), brokers: kafkatest.RealBrokers(t), seq: map[string]int64{}}
	w.topic = kafkatest.CreateTopic(t, w.brokers, partitions, nil)
	w.group = "fastlane-" + uuid.NewString()[:8]
	w.producer = kafkatest.Client(t, w.brokers, kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	w.recv = webhooktest.New()
	w.recv.Gapless = true
	w.srv = httptest.NewServer(w.recv)
	t.Cleanup(w.srv.Close)
	ss := store.NewSubscriptionStore(w.db.Pool, true, time.Hour)
	for i := range subs {
		path := fmt.Sprintf("/s/%d", i)
		url := w.srv.URL + path
		sub, err := ss.Create(context.Background(), store.SubscriptionInput{URL: &url, EventTypes: []string{"*"}})
		if err != nil {
			t.Fatalf("create subscription: %v", err)
		}
		if err := w.recv.SetSecret(path, sub.Secret); err != nil {
			t.Fatal(err)
		}
		w.subs = append(w.subs, sub)
		w.paths = append(w.paths, path)
	}
	return w
}

// produce sends n events to each asset, asset_seq continuing per asset.
func (w *world) produce(t *testing.T, assets []string, n int) {
	t.Helper()
	var recs []*kgo.Record
	for range n {
		for _, a := range assets {
			w.seq[a]++
			asset := a
			r := contract.Encode(contract.Event{
				DedupID: uuid.NewString(), Topic: w.topic, AssetID: &asset, AssetSeq: w.seq[a],
				EventType: "asset.updated", Payload: fmt.Appendf(nil, `{"asset":%q,"n":%d}`, a, w.seq[a]), CreatedAt: time.Now(),
			})
			recs = append(recs, r)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := w.producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// lane starts a fast-lane member; stop ends it gracefully.
func (w *world) lane(t *testing.T, mutate func(*Config)) (l *Lane, stop func()) {
	t.Helper()
	cfg := Config{
		Group: w.group, Topics: []string{w.topic}, AllowedCIDRs: loopback,
		RetrySchedule: []time.Duration{50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond,
			50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond},
		RefreshInterval: 200 * time.Millisecond, CommitInterval: 50 * time.Millisecond,
		SessionTimeout: 6 * time.Second, ShutdownGrace: 2 * time.Second,
		Logger: logging.New(t.Output(), "info", "text"),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	l, err := New(w.db.Pool, []kgo.Opt{kgo.SeedBrokers(w.brokers...)}, cfg)
	if err != nil {
		t.Fatalf("fastlane.New: %v", err)
	}
	return l, run(t, l.Run)
}

// slowLane starts today's engine on the same database, retrying quickly.
// schedule nil: seven retries 50 ms apart.
func (w *world) slowLane(t *testing.T, schedule []time.Duration) func() {
	t.Helper()
	if schedule == nil {
		schedule = []time.Duration{50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond,
			50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond}
	}
	d, err := delivery.NewDeliverer(w.db.Pool, delivery.Config{
		AllowedCIDRs: loopback, PollInterval: 50 * time.Millisecond, RetrySchedule: schedule,
		Logger: logging.New(t.Output(), "info", "text"),
	})
	if err != nil {
		t.Fatal(err)
	}
	return run(t, d.Run)
}

func run(t *testing.T, fn func(context.Context) error) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(60 * time.Second):
				t.Errorf("Run did not return within 60s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitAccepted waits until the receiver acknowledged want distinct events.
func (w *world) waitAccepted(t *testing.T, want int, timeout time.Duration) {
	t.Helper()
	testkit.Eventually(t, timeout, func() string {
		st := w.recv.Stats()
		return testkit.Unless(st.Accepted >= want, "receiver accepted %d of %d (requests %d, refused %d)",
			st.Accepted, want, st.Requests, st.Refused)
	})
}

// checkClean fails on any order violation, overlap or bad signature.
func (w *world) checkClean(t *testing.T) {
	t.Helper()
	st := w.recv.Stats()
	if st.OrderViolations != 0 || st.Overlaps != 0 || st.SignatureFailures != 0 || st.Malformed != 0 {
		t.Fatalf("receiver saw order violations %d, overlaps %d, signature failures %d, malformed %d: %v",
			st.OrderViolations, st.Overlaps, st.SignatureFailures, st.Malformed, st.Examples)
	}
}

// committed returns the group's committed offsets summed over the topic's
// partitions, and the topic's end offsets summed.
func (w *world) committed(t *testing.T) (committed, end int64) {
	t.Helper()
	adm := kadm.NewClient(kafkatest.Client(t, w.brokers))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := adm.FetchOffsets(ctx, w.group)
	if err != nil {
		t.Fatalf("fetch offsets: %v", err)
	}
	ends, err := adm.ListEndOffsets(ctx, w.topic)
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == w.topic {
			committed += o.At
		}
	})
	ends.Each(func(o kadm.ListedOffset) { end += o.Offset })
	return committed, end
}

func (w *world) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	return pgtest.Column[int](t, w.db.Pool, sql, args...)[0]
}

func assets(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("asset-%03d", i)
	}
	return out
}
