package consumer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/schematest"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/outbox/schema"
)

// switchableRegistry is the real schema registry behind a proxy that
// answers 503 while down is set, counting the requests it refused.
type switchableRegistry struct {
	url     string
	down    atomic.Bool
	refused atomic.Int64
}

func newSwitchableRegistry(t *testing.T, target string) *switchableRegistry {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	s := &switchableRegistry{}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: u.Scheme, Host: u.Host})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.down.Load() {
			s.refused.Add(1)
			http.Error(w, "registry down", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL + u.Path
	return s
}

// A registry outage when the consumer first meets an Avro schema id is not
// the record's fault: the batch waits (nothing dead-lettered, nothing
// stored) and, once the registry answers again, the event is delivered as
// its JSON. A schema id the registry does not know is the record's fault:
// that record alone is dead-lettered, naming the id.
func TestRegistryOutageHoldsAvroRecordsAndUnknownSchemaIDIsDeadLettered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, kafkatest.RealBackend(), 1)
	b.createTopic(t, b.topic+contract.DeadLetterSuffix, 1)
	b.subscribe(t, []string{"*"}, nil, true)

	direct, err := schema.New(schema.Config{URL: schematest.URL(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, err := direct.Register(ctx, b.topic, sr.TypeAvro,
		`{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"amount","type":"long"}]}`, ""); err != nil {
		t.Fatal(err)
	}
	payload := `{"id":"o-1","amount":10}`
	value, err := direct.Value(ctx, b.topic, []byte(payload))
	if err != nil {
		t.Fatal(err)
	}

	proxy := newSwitchableRegistry(t, schematest.URL(t))
	proxy.down.Store(true)
	viaProxy, err := schema.New(schema.Config{URL: proxy.url, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer viaProxy.Close()

	unknown := b.record("b", "order.placed", 1, "")
	unknown.Value = append([]byte{0, 0x7f, 0xff, 0xff, 0xf0}, value[5:]...)
	good := b.record("a", "order.placed", 1, "")
	good.Value = value
	b.produce(t, good)

	c := b.newConsumer(t, func(cfg *Config) { cfg.Values = viaProxy })
	start(t, c)
	testkit.Eventually(t, 60*time.Second, func() string {
		n := proxy.refused.Load()
		return testkit.Unless(n >= 3, "the registry refused %d look-ups", n)
	})
	if s := c.Stats(); s.DeadLettered != 0 {
		t.Fatalf("%d records dead-lettered while the registry was down", s.DeadLettered)
	}
	if n := b.deliveries(t); n != 0 {
		t.Fatalf("%d deliveries stored while the registry was down", n)
	}

	proxy.down.Store(false)
	b.waitDeliveries(t, 1, 60*time.Second)
	var stored string
	if err := b.db.Pool.QueryRow(ctx, `SELECT payload::text FROM bridge.deliveries`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != `{"id": "o-1", "amount": 10}` && stored != payload {
		t.Fatalf("stored payload %s, want the JSON %s", stored, payload)
	}

	b.produce(t, unknown)
	dead := b.deadLetters(t, 1)
	if reason := dead[unknown.Offset]; !strings.Contains(reason, "schema id 2147483632") {
		t.Fatalf("dead letter of offset %d: reason %q, want it to name schema id 2147483632", unknown.Offset, reason)
	}
	if s := c.Stats(); s.DeadLettered != 1 {
		t.Fatalf("%d dead-lettered, want only the unknown schema id", s.DeadLettered)
	}
}
