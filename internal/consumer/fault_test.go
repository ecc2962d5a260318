package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// The one fault the real broker cannot stage on demand: "<topic>.dlq"
// refusing writes.
func TestDeadLetterIsAcknowledgedBeforeTheOffsetCommit(t *testing.T) {
	t.Parallel()
	topic := "events"
	cluster := kafkatest.Fake(t, kfake.SeedTopics(1, topic, topic+contract.DeadLetterSuffix))
	b := &testBundle{db: pgtest.New(t), brokers: cluster.ListenAddrs(), topic: topic, group: "bridge"}
	producer := kafkatest.Client(t, b.brokers)
	b.producer = producer
	b.subscribe(t, []string{"*"}, nil, true)

	refuse := cluster.Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.Produce},
		Topic: topic + contract.DeadLetterSuffix,
		Err:   kerr.TopicAuthorizationFailed,
		Count: -1,
	})
	b.produce(t,
		b.record("a", "order.created", 1, `{}`),
		b.record("a", "order.created", 2, `not json`),
		b.record("a", "order.created", 3, `{}`))

	c := b.newConsumer(t, nil)
	start(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := refuse.Wait(ctx, 3); err != nil {
		t.Fatalf("the dead-letter produce was not retried: %v", err)
	}
	// The good records are stored, but while the dead letter is not
	// acknowledged nothing is committed: a crash now redelivers the bad
	// record instead of losing it.
	if n := b.deliveries(t); n != 2 {
		t.Errorf("%d deliveries while the dead-letter topic refuses writes, want 2", n)
	}
	if off := b.committed(t); len(off) != 0 {
		t.Fatalf("offsets %v committed before the dead letter was acknowledged", off)
	}
	if s := c.Stats(); s.DeadLettered != 0 {
		t.Errorf("DeadLettered = %d before the produce succeeded", s.DeadLettered)
	}

	refuse.Remove()
	testkit.Eventually(t, 30*time.Second, func() string {
		off := b.committed(t)
		return testkit.Unless(off[0] == 3, "committed %v", off)
	})
	if dead := kafkatest.ConsumeAll(t, b.brokers, topic+contract.DeadLetterSuffix, 1, 10*time.Second); len(dead) != 1 || string(dead[0].Value) != "not json" {
		t.Errorf("dead-letter topic holds %d records, want the one bad record", len(dead))
	}
	if s := c.Stats(); s.DeadLettered != 1 || s.Deliveries != 2 {
		t.Errorf("stats = %+v", s)
	}
}
