package relay

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	kafkasarama "github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/kafkatest"
)

// With RELAY_CLOUDEVENTS=binary the relay's record is a CloudEvent in the
// Kafka binding's binary mode: read from the real broker by sarama and
// decoded by the official CloudEvents Go SDK, it is a valid event whose id is
// the dedup id, type the event type, subject the asset id, time the row's
// commit, source RELAY_CLOUDEVENTS_SOURCE and data the payload; the bridge's
// own headers are still there, and a row header cannot shadow a ce_ one. The
// null asset's event has no subject.
func TestCloudEventsBinaryMode(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.RealBrokers(t)
	b := setup(t, brokers)
	topic := kafkatest.CreateTopic(t, brokers, 1, nil)
	ctx := context.Background()
	var id, nullID uuid.UUID
	var createdAt time.Time
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT bridge.enqueue($1, 'asset-7', 'asset.created', '{"a":1}', '{"ce_type":"spoofed","x-tenant":"t1"}')`, topic).Scan(&id); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT bridge.enqueue($1, NULL, 'system.tick', '{}')`, topic).Scan(&nullID)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.db.Pool.QueryRow(ctx, `SELECT created_at FROM bridge.outbox WHERE id = $1`, id).Scan(&createdAt); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig()
	cfg.CloudEventsSource = "https://shop.example.com/orders"
	b.startRelay(cfg)
	b.waitAllSent(2, 30*time.Second)

	msgs := saramaRead(t, brokers, topic, 2)
	events := make([]*event.Event, len(msgs))
	for i, m := range msgs {
		ev, err := binding.ToEvent(ctx, kafkasarama.NewMessageFromConsumerMessage(m))
		if err != nil {
			t.Fatalf("record %d is not a CloudEvent to the SDK: %v", i, err)
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("record %d: invalid CloudEvent: %v", i, err)
		}
		if got := headerOf(m, "dedup-id"); got != ev.ID() {
			t.Errorf("record %d: dedup-id %q, ce id %q: the bridge's headers must stay", i, got, ev.ID())
		}
		events[i] = ev
	}
	ev := events[0]
	if ev.ID() != id.String() || ev.Type() != "asset.created" || ev.Subject() != "asset-7" ||
		ev.Source() != "https://shop.example.com/orders" || ev.SpecVersion() != "1.0" ||
		ev.DataContentType() != "application/json" || string(ev.Data()) != `{"a": 1}` {
		t.Errorf("event: id %q type %q subject %q source %q specversion %q content type %q data %s",
			ev.ID(), ev.Type(), ev.Subject(), ev.Source(), ev.SpecVersion(), ev.DataContentType(), ev.Data())
	}
	if !ev.Time().Equal(createdAt) {
		t.Errorf("ce time %s, want the row's created_at %s", ev.Time(), createdAt)
	}
	if n := countHeader(msgs[0], "ce_type"); n != 1 {
		t.Errorf("%d ce_type headers: a row header must not shadow the bridge's", n)
	}
	if headerOf(msgs[0], "x-tenant") != "t1" {
		t.Errorf("the row's own header x-tenant is missing")
	}
	if null := events[1]; null.ID() != nullID.String() || null.Subject() != "" || null.Type() != "system.tick" {
		t.Errorf("null-asset event: id %q subject %q type %q", null.ID(), null.Subject(), null.Type())
	}
}

// saramaRead reads want records of topic's partition 0 with sarama, the
// client the CloudEvents SDK's Kafka binding is written for.
func saramaRead(t *testing.T, brokers []string, topic string, want int) []*sarama.ConsumerMessage {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_1_0_0
	c, err := sarama.NewConsumer(brokers, cfg)
	if err != nil {
		t.Fatalf("sarama consumer: %v", err)
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatalf("sarama consume %s: %v", topic, err)
	}
	defer pc.Close()
	var out []*sarama.ConsumerMessage
	timeout := time.After(30 * time.Second)
	for len(out) < want {
		select {
		case m := <-pc.Messages():
			out = append(out, m)
		case err := <-pc.Errors():
			t.Fatalf("sarama: %v", err)
		case <-timeout:
			t.Fatalf("sarama read %d of %d records of %s", len(out), want, topic)
		}
	}
	return out
}

func headerOf(m *sarama.ConsumerMessage, key string) string {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

func countHeader(m *sarama.ConsumerMessage, key string) int {
	n := 0
	for _, h := range m.Headers {
		if string(h.Key) == key {
			n++
		}
	}
	return n
}
