package relay

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/outbox"
)

// murmur2Vectors are Apache Kafka's UtilsTest.testMurmur2 vectors: key bytes
// → the Java client's signed murmur2.
var murmur2Vectors = []struct {
	key  string
	java int32
}{
	{"21", -973932308},
	{"foobar", -790332482},
	{"a-little-bit-long-string", -985981536},
	{"a-little-bit-longer-string", -1486304829},
	{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
	{"abc", 479470107},
}

// javaPartition is the Java client's DefaultPartitioner for a keyed record.
func javaPartition(hash int32, partitions int) int32 {
	return int32((int64(hash) & 0x7fffffff) % int64(partitions))
}

// The relay's partitioner puts every vector key where the Java client (and
// librdkafka's murmur2_random) would.
func TestPartitionerMatchesJavaMurmur2(t *testing.T) {
	t.Parallel()
	p := kgo.StickyKeyPartitioner(nil).ForTopic("t")
	for _, v := range murmur2Vectors {
		for _, n := range []int{1, 3, 6, 7, 12, 100, 1024} {
			got := p.Partition(&kgo.Record{Key: []byte(v.key)}, n)
			if want := javaPartition(v.java, n); int32(got) != want {
				t.Errorf("key %q over %d partitions: relay %d, Java %d", v.key, n, got, want)
			}
		}
	}
}

// Against both backends: events for the vector keys, relayed to a topic
// with 7 partitions, land on the partitions the Java formula gives.
func TestBrokerPartitionsLikeJava(t *testing.T) {
	runSuite(t, func(t *testing.T, b *testBundle) {
		const partitions = 7
		topic := kafkatest.CreateTopic(t, b.brokers, partitions, nil)
		var evs []outbox.Event
		for _, v := range murmur2Vectors {
			evs = append(evs, outbox.Event{Topic: topic, AssetID: v.key, EventType: "e", Payload: payload(v.key)})
		}
		b.enqueue(evs...)
		b.startRelay(fastConfig())
		recs := kafkatest.ConsumeAll(t, b.brokers, topic, len(evs), 30*time.Second)
		if len(recs) != len(evs) {
			t.Fatalf("got %d records, want %d", len(recs), len(evs))
		}
		want := map[string]int32{}
		for _, v := range murmur2Vectors {
			want[v.key] = javaPartition(v.java, partitions)
		}
		for _, r := range recs {
			if w := want[string(r.Key)]; r.Partition != w {
				t.Errorf("key %q on partition %d, Java puts it on %d", r.Key, r.Partition, w)
			}
		}
	})
}
