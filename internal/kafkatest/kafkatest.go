// Package kafkatest gives tests a Kafka cluster: the real Apache Kafka broker
// from KAFKA_BROKERS (compatibility: partitioning, headers, consumer groups),
// or an in-process kfake cluster (precise faults: a topic that rejects
// records, produce requests failing N times, a broker that disappears).
package kafkatest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/kafkaclient"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// DefaultBrokers is where scripts/services-up.sh starts Kafka.
const DefaultBrokers = "127.0.0.1:9092"

// RealBrokers returns the real broker's seed addresses, failing the test under
// CI=true (skipping otherwise) when it does not answer.
func RealBrokers(t testing.TB) []string {
	t.Helper()
	raw := os.Getenv("KAFKA_BROKERS")
	if raw == "" {
		raw = DefaultBrokers
	}
	brokers := strings.Split(raw, ",")
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DialTimeout(3*time.Second))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.Ping(ctx); err != nil {
		testkit.Unavailable(t, "Apache Kafka at "+raw, "`make services` (scripts/services-up.sh)", err)
	}
	return brokers
}

// Fake starts an in-process kfake cluster for t and closes it when t ends.
func Fake(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	opts = append([]kfake.Opt{kfake.NumBrokers(1), kfake.DefaultNumPartitions(3), kfake.AllowAutoTopicCreation()}, opts...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

var topicCounter atomic.Int64

// Client is a franz-go client seeded with brokers (and opts), closed when t
// ends: the producers and admin clients tests set up beside the code under
// test.
func Client(t testing.TB, brokers []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// TopicName returns a name no other test uses.
func TopicName(t testing.TB) string {
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		default:
			return '-'
		}
	}, t.Name())
	if len(name) > 80 {
		name = name[:80]
	}
	return fmt.Sprintf("t-%s-%d-%d", strings.ToLower(name), time.Now().UnixNano()%1e9, topicCounter.Add(1))
}

// CreateTopic creates a fresh topic with the given partitions (and configs,
// e.g. max.message.bytes) on brokers and deletes it when t ends.
func CreateTopic(t testing.TB, brokers []string, partitions int32, configs map[string]*string) string {
	t.Helper()
	name := TopicName(t)
	CreateTopicNamed(t, brokers, name, partitions, configs)
	return name
}

// CreateTopicNamed is CreateTopic for a topic whose name the test chooses
// (a "<topic>.dlq" beside a fresh topic): created, waited for until every
// partition has a leader, deleted when t ends.
func CreateTopicNamed(t testing.TB, brokers []string, name string, partitions int32, configs map[string]*string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, partitions, 1, configs, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		cl.Close()
		t.Fatalf("create topic %s: %v", name, err)
	}
	// Wait until the metadata shows every partition with a leader, so the
	// first produce does not race topic creation.
	if kafkaclient.WaitTopicReady(ctx, adm, name, int(partitions), 0) != nil {
		cl.Close()
		t.Fatalf("topic %s never became ready", name)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, name)
		cl.Close()
	})
}

// ConsumeAll reads every record of topic from the start until want records
// arrived or the timeout passed.
func ConsumeAll(t testing.TB, brokers []string, topic string, want int, timeout time.Duration) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatalf("kafka consumer: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		fs.EachError(func(topic string, p int32, err error) {
			t.Logf("fetch %s/%d: %v", topic, p, err)
		})
		out = append(out, fs.Records()...)
	}
	return out
}

// GroupBehind is how many records of topics group has not committed past:
// the topics' end offsets minus the group's committed offsets (a partition
// without a commit counts from 0).
func GroupBehind(t testing.TB, brokers []string, group string, topics ...string) int64 {
	t.Helper()
	adm := kadm.NewClient(Client(t, brokers))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("fetch offsets of %s: %v", group, err)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	var behind int64
	ends.Each(func(o kadm.ListedOffset) {
		committed := int64(0)
		if c, ok := offs.Lookup(o.Topic, o.Partition); ok && c.Err == nil {
			committed = c.At
		}
		behind += o.Offset - committed
	})
	return behind
}

// Backend is one Kafka implementation a suite runs against. Run a suite over
// every backend with RunBackends, so one set of tests proves behaviour
// against kfake (in process, fresh per test) and the real Apache Kafka
// broker (wire compatibility, the broker's own group coordinator), the way
// Watermill's pubsub/tests runs one suite over every Pub/Sub.
type Backend struct {
	// Name is the subtest name: "kfake" or "kafka".
	Name string
	// Brokers returns seed brokers for t: a new kfake cluster for each call
	// (closed when t ends), or the real broker (RealBrokers: fails under
	// CI=true, skips elsewhere, when it does not answer).
	Brokers func(t testing.TB) []string
	// Fake is true for kfake; a test that needs the real broker's behaviour
	// (or kfake's fault injection) can branch on it, and says why.
	Fake bool
}

// FakeBackend is kfake: a new in-process cluster for each Brokers call.
func FakeBackend() Backend {
	return Backend{Name: "kfake", Fake: true, Brokers: func(t testing.TB) []string { return Fake(t).ListenAddrs() }}
}

// RealBackend is the Apache Kafka broker of KAFKA_BROKERS (benchmarks, and
// tests of what only the real group coordinator does).
func RealBackend() Backend { return Backend{Name: "kafka", Brokers: RealBrokers} }

// Backends lists the backends: kfake, then the real broker.
func Backends() []Backend { return []Backend{FakeBackend(), RealBackend()} }

// RunParallel is the opening of a suite test whose state is its own (a
// database and topics of its own): it marks t parallel, since such a test
// disturbs no other, and runs suite once per backend (RunBackends). A test
// that must run alone (one timing the machine) calls RunBackends itself.
func RunParallel(t *testing.T, suite func(t *testing.T, b Backend)) {
	t.Helper()
	t.Parallel()
	RunBackends(t, suite)
}

// RunBackends runs suite once per backend, each as a subtest named by the
// backend (TestX/kfake, TestX/kafka), in parallel with each other.
func RunBackends(t *testing.T, suite func(t *testing.T, b Backend)) {
	t.Helper()
	for _, b := range Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			suite(t, b)
		})
	}
}
