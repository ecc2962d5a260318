package relay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/schematest"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/outbox/schema"
)

const orderSchema = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"id":{"type":"string"},"amount":{"type":"integer","minimum":0},"tags":{"type":"array","items":{"type":"string"}},"customer":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}},"required":["id","amount"]}`

// sqlEnqueue writes an event the way an application without the Go package
// does (bridge.enqueue in plain SQL): nothing validates it on the way in.
func (b *testBundle) sqlEnqueue(topic, asset, eventType, payload string) uuid.UUID {
	b.t.Helper()
	var id uuid.UUID
	err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		return tx.QueryRow(context.Background(),
			`SELECT bridge.enqueue($1, $2, $3, $4::jsonb, '{}'::jsonb, NULL, NULL)`, topic, asset, eventType, payload).Scan(&id)
	})
	if err != nil {
		b.t.Fatalf("enqueue through SQL: %v", err)
	}
	return id
}

// A governed topic end to end through the relay: the events enqueued through
// plain SQL that match the schema go out framed (magic byte 0, schema id,
// the JSON) with the usual headers; the one that does not is parked as FAILED
// at its first try, with the schema, path and rule, while the others of its
// asset and of other assets flow; an ungoverned topic in the same batches is
// untouched. Then Confluent's own Python deserializer reads the governed
// topic through the registry and gets every field back.
func TestGovernedTopicThroughRelay(t *testing.T) {
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
	plainTopic := kafkatest.CreateTopic(t, b.brokers, 1, nil)
	v1, err := reg.Register(ctx, topic, sr.TypeJSON, orderSchema, "BACKWARD")
	if err != nil {
		t.Fatal(err)
	}

	good := []string{
		`{"id": "o-1", "amount": 10, "tags": ["a", "b"], "customer": {"name": "Ada"}}`,
		`{"id": "o-2", "amount": 0}`,
		`{"id": "o-3", "amount": 7, "customer": {"name": "Bo"}}`,
	}
	ids := map[string]string{} // dedup id -> payload
	ids[b.sqlEnqueue(topic, "a", "order.placed", good[0]).String()] = good[0]
	bad := b.sqlEnqueue(topic, "a", "order.placed", `{"id": "o-x", "amount": 5, "customer": {"nickname": "no name"}}`)
	ids[b.sqlEnqueue(topic, "a", "order.placed", good[1]).String()] = good[1]
	ids[b.sqlEnqueue(topic, "b", "order.placed", good[2]).String()] = good[2]
	plain := b.sqlEnqueue(plainTopic, "a", "anything", `{"free": "form", "amount": "not a number"}`)

	cfg := fastConfig()
	cfg.Values = reg
	b.startRelay(cfg)
	testkit.Eventually(t, 30*time.Second, func() string {
		c := b.countStatus()
		return testkit.Unless(c["FAILED"] == 1 && c["SENT"] == 4, "bad row FAILED, the 4 others SENT: %v", c)
	})
	r := b.row(bad)
	if r.Status != "FAILED" || r.Attempts != 1 {
		t.Fatalf("bad row: %+v, want FAILED at its first try", r)
	}
	for _, want := range []string{schema.Subject(topic), "version 1", "at /customer:", `rule "required"`, "name"} {
		if !strings.Contains(r.LastError, want) {
			t.Errorf("reason %q does not contain %q", r.LastError, want)
		}
	}

	recs := kafkatest.ConsumeAll(t, b.brokers, topic, 3, 30*time.Second)
	for _, rec := range recs {
		id := header(rec, "dedup-id")
		want, ok := ids[id]
		if !ok {
			t.Fatalf("unexpected record %s on the governed topic", id)
		}
		sid, js, framed := schema.Unframe(rec.Value)
		if !framed || sid != v1.ID || !sameJSON(t, js, []byte(want)) {
			t.Errorf("record %s value %q: want framing with id %d and the payload", id, rec.Value, v1.ID)
		}
		if header(rec, "content-type") == "" || header(rec, "event-type") != "order.placed" {
			t.Errorf("record %s lost its headers: %v", id, rec.Headers)
		}
	}
	prec := kafkatest.ConsumeAll(t, b.brokers, plainTopic, 1, 30*time.Second)
	if header(prec[0], "dedup-id") != plain.String() || prec[0].Value[0] != '{' {
		t.Errorf("ungoverned record %q: want the payload as stored, unframed", prec[0].Value)
	}

	// A reader no one here wrote: Confluent's Python client.
	got := confluentRead(t, b.brokers[0], topic, url, 3)
	for id, want := range ids {
		var w any
		if err := json.Unmarshal([]byte(want), &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got[id], w) {
			t.Errorf("confluent-kafka read %s as %v, want %v", id, got[id], w)
		}
	}
}

// sameJSON reports whether a and b hold the same JSON value (the stored
// payload is jsonb: its spacing and key order are PostgreSQL's).
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		return false
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}

// confluentRead reads n records of topic with confluent-kafka's
// JSONDeserializer (testdata/confluent_read.py) and returns the values by
// dedup id.
func confluentRead(t *testing.T, bootstrap, topic, registryURL string, n int, format ...string) map[string]any {
	t.Helper()
	py := schematest.ConfluentPython(t)
	script := filepath.Join(schematest.RepoRoot(t), "internal", "relay", "testdata", "confluent_read.py")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, append([]string{script, bootstrap, topic, registryURL, fmt.Sprint(n), "60"}, format...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("confluent_read.py: %v\n%s", err, stderr.String())
	}
	got := map[string]any{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var line struct {
			DedupID string `json:"dedup_id"`
			Value   any    `json:"value"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("confluent_read.py printed %q: %v", sc.Text(), err)
		}
		got[line.DedupID] = line.Value
	}
	if len(got) != n {
		t.Fatalf("confluent_read.py read %d records, want %d:\n%s\n%s", len(got), n, out, stderr.String())
	}
	return got
}
