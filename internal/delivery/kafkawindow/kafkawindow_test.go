package kafkawindow

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

// event is one record produced at a chosen time on a chosen partition.
type event struct {
	asset string
	seq   int64
	typ   string
	at    time.Time
	part  int32
	id    string
}

func produce(t *testing.T, brokers []string, topic string, evs []*event) {
	t.Helper()
	cl := kafkatest.Client(t, brokers, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var recs []*kgo.Record
	for _, e := range evs {
		asset := e.asset
		e.id = uuid.NewString()
		r := contract.Encode(contract.Event{DedupID: e.id, Topic: topic, AssetID: &asset, AssetSeq: e.seq, EventType: e.typ,
			Payload: fmt.Appendf(nil, `{"asset":%q,"seq":%d}`, asset, e.seq), CreatedAt: e.at})
		r.Timestamp = e.at // the broker keeps the producer's time (CreateTime)
		r.Partition = e.part
		recs = append(recs, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func newSubscription(t *testing.T, db *pgtest.DB, types []string) *store.Subscription {
	t.Helper()
	url := "http://127.0.0.1:9/in"
	sub, err := store.NewSubscriptionStore(db.Pool, true, time.Hour).Create(context.Background(), store.SubscriptionInput{URL: &url, EventTypes: types})
	if err != nil {
		t.Fatalf("create subscription: %v", err)
	}
	return sub
}

// TestRecoverReadsTheWindowFromKafkaInAssetOrder: a window [since, until)
// is found in the topic by time; exactly its matching events become the
// subscription's deliveries, each asset's in asset_seq order, their streams
// parked (so the fast lane queues behind them); run again, it adds nothing.
func TestRecoverReadsTheWindowFromKafkaInAssetOrder(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	brokers := kafkatest.RealBrokers(t)
	topic := kafkatest.CreateTopic(t, brokers, 3, nil)
	base := time.Now().Add(-2 * time.Hour).Truncate(time.Millisecond)
	assets := []string{"a-0", "a-1", "a-2", "a-3"}
	var evs []*event
	for i := range 30 {
		for j, a := range assets {
			typ := "asset.updated"
			if i%3 == 2 {
				typ = "report.built" // not the subscription's
			}
			evs = append(evs, &event{asset: a, seq: int64(i + 1), typ: typ, at: base.Add(time.Duration(i) * time.Minute), part: int32(j % 3)})
		}
	}
	produce(t, brokers, topic, evs)
	sub := newSubscription(t, db, []string{"asset.*"})
	since, until := base.Add(10*time.Minute), base.Add(20*time.Minute)
	want := map[string]bool{}
	for _, e := range evs {
		if !e.at.Before(since) && e.at.Before(until) && e.typ == "asset.updated" {
			want[e.id] = true
		}
	}
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	filter := contract.Filter{Enabled: true, EventTypes: sub.EventTypes, Topic: sub.Topic}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The fast lane has started: the markers are on.
	if _, err := store.NewDeliveryStore(db.Pool).EnableParks(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := Recover(ctx, db.Pool, opts, nil, sub.ID, filter, []string{topic}, store.Window{Since: since, Until: &until})
	if err != nil {
		t.Fatalf("recover: %v", err)
	}
	if res.Queued != len(want) || res.Undecodable != 0 {
		t.Fatalf("queued %d (undecodable %d), want the window's %d matching events", res.Queued, res.Undecodable, len(want))
	}
	type row struct {
		EventID  string `db:"event_id"`
		AssetID  string `db:"asset_id"`
		AssetSeq int64  `db:"asset_seq"`
	}
	rows := pgtest.Structs[row](t, db.Pool, `SELECT event_id, asset_id, asset_seq FROM bridge.deliveries
		WHERE subscription_id = $1 AND status = 'pending' ORDER BY seq`, sub.ID)
	last := map[string]int64{}
	for _, r := range rows {
		if !want[r.EventID] {
			t.Errorf("delivery of %s (%s #%d) is not an event of the window", r.EventID, r.AssetID, r.AssetSeq)
		}
		if r.AssetSeq <= last[r.AssetID] {
			t.Errorf("asset %s: #%d queued after #%d", r.AssetID, r.AssetSeq, last[r.AssetID])
		}
		last[r.AssetID] = r.AssetSeq
	}
	if len(rows) != len(want) {
		t.Fatalf("%d pending deliveries, want %d", len(rows), len(want))
	}
	parks := pgtest.Column[string](t, db.Pool, `SELECT asset_key FROM bridge.delivery_parks WHERE subscription_id = $1 ORDER BY 1`, sub.ID)
	if strings.Join(parks, ",") != strings.Join(assets, ",") {
		t.Errorf("parked streams %v, want every asset's %v", parks, assets)
	}
	again, err := Recover(ctx, db.Pool, opts, nil, sub.ID, filter, []string{topic}, store.Window{Since: since, Until: &until})
	if err != nil || again.Queued != 0 {
		t.Fatalf("recover again: queued %d, err %v; want nothing more (each event once per subscription)", again.Queued, err)
	}
}

// TestRecoverRefusesAWindowPastTheTopicsRetention: once records of a
// partition are deleted (the log start moved, as retention moves it), a
// window starting before its oldest record left is refused naming the
// earliest time still available, and nothing is written; a window from
// that time is read.
func TestRecoverRefusesAWindowPastTheTopicsRetention(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	brokers := kafkatest.RealBrokers(t)
	topic := kafkatest.CreateTopic(t, brokers, 2, nil)
	base := time.Now().Add(-3 * time.Hour).Truncate(time.Millisecond)
	var evs []*event
	for i := range 10 {
		for p := range int32(2) {
			evs = append(evs, &event{asset: fmt.Sprintf("p%d", p), seq: int64(i + 1), typ: "asset.updated",
				at: base.Add(time.Duration(i) * time.Minute), part: p})
		}
	}
	produce(t, brokers, topic, evs)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adm := kadm.NewClient(kafkatest.Client(t, brokers))
	// What retention does to a partition: its log start moves past the
	// oldest records. Partition 0 loses its first five.
	var del kadm.Offsets
	del.Add(kadm.Offset{Topic: topic, Partition: 0, At: 5})
	dr, err := adm.DeleteRecords(ctx, del)
	if err == nil {
		err = dr.Error()
	}
	if err != nil {
		t.Fatalf("delete records: %v", err)
	}
	sub := newSubscription(t, db, []string{"*"})
	filter := contract.Filter{Enabled: true, EventTypes: sub.EventTypes}
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	earliest := base.Add(5 * time.Minute) // partition 0's oldest record left

	_, err = Recover(ctx, db.Pool, opts, nil, sub.ID, filter, []string{topic}, store.Window{Since: base})
	var re *RetentionError
	if !errors.As(err, &re) {
		t.Fatalf("recover from before the retention: err %v, want a *RetentionError", err)
	}
	if !re.Earliest.Equal(earliest) || re.Topic != topic || re.Partition != 0 {
		t.Errorf("refusal names %s partition %d earliest %s; want %s partition 0 earliest %s",
			re.Topic, re.Partition, re.Earliest, topic, earliest)
	}
	if msg := err.Error(); !strings.Contains(msg, "earliest time still available is "+earliest.UTC().Format(time.RFC3339Nano)) {
		t.Errorf("the error does not name the earliest time: %q", msg)
	}
	if n := pgtest.Column[int64](t, db.Pool, `SELECT count(*) FROM bridge.deliveries`)[0]; n != 0 {
		t.Fatalf("a refused recovery wrote %d deliveries", n)
	}

	res, err := Recover(ctx, db.Pool, opts, nil, sub.ID, filter, []string{topic}, store.Window{Since: earliest})
	if err != nil {
		t.Fatalf("recover from the earliest time still available: %v", err)
	}
	if res.Queued != 10 { // 5 left in partition 0, 5 of partition 1 from that time
		t.Fatalf("queued %d, want 10", res.Queued)
	}
}
