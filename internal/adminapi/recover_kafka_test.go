package adminapi

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery/kafkawindow"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

// TestRecoverWithTheFastLaneReadsTheWindowFromKafka: with the fast lane on,
// POST /deliveries/recover reads the window from the topic by time and
// queues its events for the subscription; a window reaching past what the
// topic still holds is a 400 on since naming the earliest time still
// available, and writes nothing.
func TestRecoverWithTheFastLaneReadsTheWindowFromKafka(t *testing.T) {
	db := pgtest.NewParallel(t)
	sawDB.Store(true)
	brokers := kafkatest.RealBrokers(t)
	topic := kafkatest.CreateTopic(t, brokers, 1, nil)
	mux := http.NewServeMux()
	src := &kafkawindow.Source{Opts: []kgo.Opt{kgo.SeedBrokers(brokers...)}, Topics: []string{topic}}
	if !Mount(mux, Config{Token: testToken, Pool: db.Pool, AllowHTTP: true, SecretGrace: time.Hour, KafkaWindow: src}) {
		t.Fatal("Mount with a token mounted nothing")
	}
	b := &bundle{db: db, mux: mux}
	sub := b.createSubscription(t, "https://a.example.com/h")

	base := time.Now().Add(-4 * time.Hour).Truncate(time.Millisecond)
	cl := kafkatest.Client(t, brokers)
	var recs []*kgo.Record
	for i := range 8 {
		asset := "a-1"
		r := contract.Encode(contract.Event{DedupID: uuid.NewString(), Topic: topic, AssetID: &asset, AssetSeq: int64(i + 1),
			EventType: "asset.updated", Payload: []byte(`{}`), CreatedAt: base})
		r.Timestamp = base.Add(time.Duration(i) * 10 * time.Minute)
		recs = append(recs, r)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// Retention's effect: the first two records are gone.
	var del kadm.Offsets
	del.Add(kadm.Offset{Topic: topic, Partition: 0, At: 2})
	if dr, err := kadm.NewClient(cl).DeleteRecords(ctx, del); err != nil || dr.Error() != nil {
		t.Fatalf("delete records: %v %v", err, dr.Error())
	}
	earliest := base.Add(20 * time.Minute)

	res := b.do(t, "POST", "/api/v1/deliveries/recover", fmt.Sprintf(`{"subscription_id": %q, "since": %q}`,
		sub, base.UTC().Format(time.RFC3339Nano)))
	res.wantError(t, http.StatusBadRequest, "since")
	if !strings.Contains(string(res.Body), earliest.UTC().Format(time.RFC3339Nano)) {
		t.Errorf("the refusal does not name the earliest time still available (%s): %s", earliest.UTC().Format(time.RFC3339Nano), res.Body)
	}
	if n := pgtest.Column[int64](t, db.Pool, `SELECT count(*) FROM bridge.deliveries`)[0]; n != 0 {
		t.Fatalf("a refused recover wrote %d deliveries", n)
	}
	// A new subscription's history is read the same way: refused alike.
	created := b.do(t, "POST", "/api/v1/subscriptions", fmt.Sprintf(`{"url": "https://b.example.com/h", "event_types": ["*"], "since": %q}`,
		base.UTC().Format(time.RFC3339Nano)))
	created.wantError(t, http.StatusBadRequest, "since")
	if !strings.Contains(string(created.Body), earliest.UTC().Format(time.RFC3339Nano)) {
		t.Errorf("the refused create does not name the earliest time still available: %s", created.Body)
	}

	// From the 4th record's time to the 7th's: records 4, 5 and 6.
	got := b.do(t, "POST", "/api/v1/deliveries/recover", fmt.Sprintf(`{"subscription_id": %q, "since": %q, "until": %q}`, sub,
		base.Add(30*time.Minute).UTC().Format(time.RFC3339Nano), base.Add(60*time.Minute).UTC().Format(time.RFC3339Nano))).
		want(t, http.StatusOK).obj(t)
	if fmt.Sprint(got["read_from_kafka"], got["queued_from_kafka"], got["recovered"]) != "3 3 0" {
		t.Fatalf("recover = %v; want 3 records read, 3 queued, 0 dead revived", got)
	}
	seqs := pgtest.Column[int64](t, db.Pool, `SELECT asset_seq FROM bridge.deliveries WHERE subscription_id = $1 ORDER BY seq`, sub)
	if fmt.Sprint(seqs) != "[4 5 6]" {
		t.Fatalf("queued asset_seq %v, want [4 5 6] in that order", seqs)
	}
}
