package relay

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/schematest"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/outbox/schema"
)

// avroOrderSchema has a field of every kind the JSON ↔ Avro mapping covers.
const avroOrderSchema = `{"type":"record","name":"Order","namespace":"bridge.test","fields":[
 {"name":"id","type":"string"},
 {"name":"amount","type":"long"},
 {"name":"qty","type":"int"},
 {"name":"ratio","type":"double"},
 {"name":"weight","type":"float"},
 {"name":"paid","type":"boolean"},
 {"name":"note","type":["null","string"],"default":null},
 {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID"]}},
 {"name":"tags","type":{"type":"array","items":"string"}},
 {"name":"attrs","type":{"type":"map","values":"long"}},
 {"name":"customer","type":{"type":"record","name":"Customer","fields":[{"name":"name","type":"string"}]}},
 {"name":"blob","type":"bytes"},
 {"name":"digest","type":{"type":"fixed","name":"Digest","size":4}},
 {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
 {"name":"created","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"day","type":{"type":"int","logicalType":"date"}},
 {"name":"ref","type":{"type":"string","logicalType":"uuid"}}
]}`

// An Avro-governed topic end to end: the relay writes the JSON payloads
// enqueued through SQL as framed Avro binary; one that does not fit is
// parked FAILED at its first try naming the field, while the others flow;
// the webhook stage's decode gives back the JSON; Confluent's Python
// AvroDeserializer reads every field.
func TestGovernedAvroTopicThroughRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, kafkatest.RealBrokers(t))
	url := schematest.URL(t)
	reg, err := schema.New(schema.Config{URL: url, RefreshInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	topic := schematest.Topic(t)
	kafkatest.CreateTopicNamed(t, b.brokers, topic, 3, nil)
	v1, err := reg.Register(ctx, topic, sr.TypeAvro, avroOrderSchema, "BACKWARD")
	if err != nil {
		t.Fatal(err)
	}
	good := []string{
		`{"id":"o-1","amount":1200,"qty":3,"ratio":0.25,"weight":1.5,"paid":true,"note":"gift","status":"PAID","tags":["a","b"],"attrs":{"k":7},"customer":{"name":"Ann"},"blob":"aGVsbG8=","digest":"AQIDBA==","price":"-12.30","created":"2026-12-07T01:02:03.456Z","day":"2026-12-07","ref":"6f1c2b9e-3f4a-4c1d-9a7e-0b8d2e5f6a71"}`,
		`{"id":"o-2","amount":-5,"qty":0,"ratio":1e-3,"weight":0,"paid":false,"note":null,"status":"NEW","tags":[],"attrs":{},"customer":{"name":""},"blob":"","digest":"AAAAAA==","price":"0.01","created":"1969-12-31T23:59:59.999Z","day":"1970-01-01","ref":"00000000-0000-0000-0000-000000000000"}`,
		`{"id":"o-3","amount":9007199254740993,"qty":-2147483648,"ratio":-2.5,"weight":-0.5,"paid":true,"note":"x","status":"NEW","tags":["only"],"attrs":{"a":1,"b":-1},"customer":{"name":"Bo"},"blob":"/w==","digest":"/////w==","price":"99999999.99","created":"2038-01-19T03:14:08.001Z","day":"2100-02-28","ref":"6f1c2b9e-3f4a-4c1d-9a7e-0b8d2e5f6a72"}`,
	}
	ids := map[string]string{}
	ids[b.sqlEnqueue(topic, "a", "order.placed", good[0]).String()] = good[0]
	bad := b.sqlEnqueue(topic, "a", "order.placed", strings.Replace(good[1], `"status":"NEW"`, `"status":"LOST"`, 1))
	ids[b.sqlEnqueue(topic, "a", "order.placed", good[1]).String()] = good[1]
	ids[b.sqlEnqueue(topic, "b", "order.placed", good[2]).String()] = good[2]

	cfg := fastConfig()
	cfg.Values = reg
	b.startRelay(cfg)
	testkit.Eventually(t, 30*time.Second, func() string {
		c := b.countStatus()
		return testkit.Unless(c["FAILED"] == 1 && c["SENT"] == 3, "bad row FAILED, the 3 others SENT: %v", c)
	})
	r := b.row(bad)
	if r.Status != "FAILED" || r.Attempts != 1 {
		t.Fatalf("bad row: %+v, want FAILED at its first try", r)
	}
	for _, want := range []string{schema.Subject(topic), "version 1", "at /status:", `rule "enum"`, `"LOST"`} {
		if !strings.Contains(r.LastError, want) {
			t.Errorf("reason %q does not contain %q", r.LastError, want)
		}
	}

	// A decoder that has not seen the schema (as the consumer's process).
	dec, err := schema.New(schema.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	recs := kafkatest.ConsumeAll(t, b.brokers, topic, 3, 30*time.Second)
	for _, rec := range recs {
		id := header(rec, "dedup-id")
		want, ok := ids[id]
		if !ok {
			t.Fatalf("unexpected record %s", id)
		}
		sid, body, framed := schema.Unframe(rec.Value)
		if !framed || sid != v1.ID || json.Valid(body) {
			t.Errorf("record %s value %q: want framing with id %d and Avro binary", id, rec.Value, v1.ID)
		}
		js, err := dec.DecodeValue(ctx, rec.Value)
		if err != nil || !sameJSON(t, js, []byte(want)) {
			t.Errorf("record %s decoded to %s (%v), want %s", id, js, err, want)
		}
	}

	got := confluentRead(t, b.brokers[0], topic, url, 3, "avro")
	for id, want := range ids {
		var w any
		if err := json.Unmarshal([]byte(want), &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got[id], w) {
			t.Errorf("confluent-kafka AvroDeserializer read %s as\n %v\nwant\n %v", id, got[id], w)
		}
	}
}
