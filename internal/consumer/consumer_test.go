package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/service"
	"github.com/outboxbridge/bridge/internal/testkit"
)

func TestRecordsBecomeDeliveriesForMatchingSubscriptionsOnly(t *testing.T) {
	runSuite(t, 3, func(t *testing.T, b *testBundle) {
		other := "some-other-topic"
		subs := map[string]string{
			"exact":       b.subscribe(t, []string{"order.created"}, nil, true),
			"prefix":      b.subscribe(t, []string{"order.*"}, nil, true),
			"all":         b.subscribe(t, []string{"*"}, nil, true),
			"other topic": b.subscribe(t, []string{"*"}, &other, true),
			"this topic":  b.subscribe(t, []string{"order.created"}, &b.topic, true),
			"disabled":    b.subscribe(t, []string{"*"}, nil, false),
			"customer":    b.subscribe(t, []string{"customer.*", "nothing.matches"}, nil, true),
		}
		want := map[string][]string{
			"exact":       {"order.created"},
			"prefix":      {"order.created", "order.item.added"},
			"all":         {"customer.updated", "order", "order.created", "order.item.added"},
			"other topic": nil,
			"this topic":  {"order.created"},
			"disabled":    nil,
			"customer":    {"customer.updated"},
		}
		tp := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		created := b.record("a1", "order.created", 1, `{"n":1}`)
		created.Headers = append(created.Headers, kgo.RecordHeader{Key: contract.HeaderTraceparent, Value: []byte(tp)})
		created.Timestamp = time.Date(2026, 11, 30, 9, 0, 0, 123_000_000, time.UTC)
		// The relay's records carry the event's creation time in
		// created-at (microseconds, as PostgreSQL keeps them), whatever
		// their record timestamp; a created-at that does not parse leaves
		// the record timestamp, and the record is not dead-lettered.
		itemCreated := time.Date(2026, 11, 30, 8, 59, 59, 987_654_000, time.UTC)
		item := b.record("a2", "order.item.added", 7, `{"n":2}`)
		item.Headers = append(item.Headers, kgo.RecordHeader{Key: contract.HeaderCreatedAt, Value: []byte(itemCreated.Format(time.RFC3339Nano))})
		item.Timestamp = time.Date(2026, 11, 30, 9, 0, 5, 0, time.UTC)
		bad := b.record("a1", "order", 2, `[1,2,3]`)
		bad.Headers = append(bad.Headers, kgo.RecordHeader{Key: contract.HeaderCreatedAt, Value: []byte("not a time")})
		bad.Timestamp = time.Date(2026, 11, 30, 9, 0, 6, 0, time.UTC)
		recs := []*kgo.Record{
			created,
			item,
			b.record("", "customer.updated", 3, `{"n":3}`), // empty key: the null asset
			bad,
		}
		b.produce(t, recs...)

		c := b.newConsumer(t, nil)
		stop, _ := start(t, c)
		b.waitDeliveries(t, 9, 60*time.Second)

		for name, id := range subs {
			got := pgtest.Column[string](t, b.db.Pool,
				`SELECT event_type FROM bridge.deliveries WHERE subscription_id = $1 ORDER BY event_type`, id)
			if !slices.Equal(got, want[name]) {
				t.Errorf("subscription %q got event types %v, want %v", name, got, want[name])
			}
		}

		// The row carries the record: dedup id, type, topic, asset, asset-seq,
		// payload, timestamp, and (no SDK here) the header's traceparent.
		var (
			eventID, eventType, topic, payload string
			assetID, traceparent               *string
			assetSeq                           *int64
			createdAt                          time.Time
			status                             string
		)
		err := b.db.Pool.QueryRow(context.Background(), `
			SELECT event_id, event_type, topic, asset_id, asset_seq, payload::text, event_created_at, traceparent, status
			FROM bridge.deliveries WHERE subscription_id = $1`, subs["exact"]).
			Scan(&eventID, &eventType, &topic, &assetID, &assetSeq, &payload, &createdAt, &traceparent, &status)
		if err != nil {
			t.Fatal(err)
		}
		dedup, _ := header(created, contract.HeaderDedupID)
		switch {
		case eventID != dedup, eventType != "order.created", topic != b.topic, status != "pending":
			t.Errorf("delivery = (%s, %s, %s, %s), want (%s, order.created, %s, pending)", eventID, eventType, topic, status, dedup, b.topic)
		case assetID == nil || *assetID != "a1" || assetSeq == nil || *assetSeq != 1:
			t.Errorf("asset = %v/%v, want a1/1", assetID, assetSeq)
		case payload != `{"n": 1}`:
			t.Errorf("payload = %s", payload)
		case !createdAt.Equal(created.Timestamp):
			t.Errorf("event_created_at = %s, want the record timestamp %s", createdAt, created.Timestamp)
		case traceparent == nil || *traceparent != tp:
			t.Errorf("traceparent = %v, want the header's %s", traceparent, tp)
		}
		for _, c := range []struct {
			eventType string
			want      time.Time
		}{{"order.item.added", itemCreated}, {"order", bad.Timestamp}} {
			for _, at := range pgtest.Column[time.Time](t, b.db.Pool, `SELECT event_created_at FROM bridge.deliveries WHERE event_type = $1`, c.eventType) {
				if !at.Equal(c.want) {
					t.Errorf("%s: event_created_at = %s, want %s", c.eventType, at.UTC().Format(time.RFC3339Nano), c.want.Format(time.RFC3339Nano))
				}
			}
		}
		var nullAsset int
		nullAsset = b.count(t, `SELECT count(*) FROM bridge.deliveries WHERE event_type = 'customer.updated' AND asset_id IS NULL AND asset_seq = 3`)
		if nullAsset != 2 {
			t.Errorf("customer.updated deliveries with NULL asset_id = %d, want 2", nullAsset)
		}

		// Offsets are committed up to the end, and lag says so.
		testkit.Eventually(t, 30*time.Second, func() string {
			lags, err := c.Lag(context.Background())
			if err != nil {
				return err.Error()
			}
			var total int64
			for _, l := range lags {
				if l.Topic == b.topic {
					total += l.Lag
				}
			}
			return testkit.Unless(len(lags) == 3 && total == 0, "lags %+v", lags)
		})
		if err := stop(); err != nil {
			t.Fatalf("Run returned %v on graceful shutdown, want nil", err)
		}
		var committed int64
		for _, off := range b.committed(t) {
			committed += off
		}
		if committed != int64(len(recs)) {
			t.Errorf("committed offsets sum to %d, want %d", committed, len(recs))
		}
		if s := c.Stats(); s.Records != 4 || s.Deliveries != 9 || s.Duplicates != 0 || s.DeadLettered != 0 {
			t.Errorf("stats = %+v", s)
		}
	})
}

func TestRedeliveryAfterCrashBeforeOffsetCommitCreatesNoDuplicateDelivery(t *testing.T) {
	runSuite(t, 2, func(t *testing.T, b *testBundle) {
		b.subscribe(t, []string{"*"}, nil, true)
		b.subscribe(t, []string{"order.*"}, nil, true)
		const n = 20
		var recs []*kgo.Record
		for i := range n {
			recs = append(recs, b.record(fmt.Sprintf("asset-%d", i%5), "order.created", int64(i/5+1), fmt.Sprintf(`{"i":%d}`, i)))
		}
		b.produce(t, recs...)

		// The first consumer stores its first batch, then "crashes" before the
		// offset commit.
		crashed := b.newConsumer(t, func(cfg *Config) { cfg.MaxPollRecords = 7 })
		var stored int
		crashed.beforeCommit = func(batch []*kgo.Record) error {
			stored = len(batch)
			return errors.New("killed")
		}
		stopCrashed, done := start(t, crashed)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatal("the crashing consumer never processed a batch")
		}
		if err := stopCrashed(); !errors.Is(err, errCrash) {
			t.Fatalf("crashing consumer's Run = %v, want the simulated crash", err)
		}
		if stored == 0 || stored == n {
			t.Fatalf("the crashing consumer stored %d of %d records; want part of them", stored, n)
		}
		if got := b.deliveries(t); got != 2*stored {
			t.Fatalf("after the crash: %d deliveries, want %d (2 per stored record)", got, 2*stored)
		}
		if off := b.committed(t); len(off) != 0 {
			t.Fatalf("the crashed consumer committed offsets %v", off)
		}
		before := b.count(t, `SELECT coalesce(sum(id), 0) FROM bridge.deliveries`)

		// A fresh member of the same group gets every record again.
		fresh := b.newConsumer(t, nil)
		stop, _ := start(t, fresh)
		b.waitDeliveries(t, 2*n, 60*time.Second)
		testkit.Eventually(t, 30*time.Second, func() string {
			s := fresh.Stats()
			return testkit.Unless(s.Records == n, "fresh consumer stats %+v", s)
		})
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		s := fresh.Stats()
		if s.Duplicates != int64(stored) || s.Deliveries != int64(2*(n-stored)) {
			t.Errorf("fresh consumer: %d duplicates and %d deliveries, want %d and %d", s.Duplicates, s.Deliveries, stored, 2*(n-stored))
		}
		// The crashed batch's rows are untouched, and every event has exactly one
		// delivery per subscription.
		if after := b.count(t, `SELECT coalesce(sum(id), 0) FROM bridge.deliveries WHERE id IN (SELECT id FROM bridge.deliveries ORDER BY id LIMIT $1)`, 2*stored); after != before {
			t.Errorf("the crashed batch's deliveries changed: id sum %d, was %d", after, before)
		}
		if bad := b.count(t, `SELECT count(*) FROM (SELECT event_id FROM bridge.deliveries GROUP BY event_id HAVING count(*) <> 2) x`); bad != 0 {
			t.Errorf("%d events without exactly 2 deliveries", bad)
		}
		if inbox := b.count(t, `SELECT count(*) FROM bridge.consumer_inbox`); inbox != n {
			t.Errorf("inbox rows = %d, want %d", inbox, n)
		}
	})
}

func TestSameDedupIDProducedTwiceYieldsOneDeliveryPerSubscription(t *testing.T) {
	runSuite(t, 1, func(t *testing.T, b *testBundle) {
		b.subscribe(t, []string{"*"}, nil, true)
		b.subscribe(t, []string{"order.created"}, nil, true)
		c := b.newConsumer(t, nil)
		start(t, c)

		x := b.record("a", "order.created", 1, `{"x":1}`)
		b.produce(t, x)
		b.waitDeliveries(t, 2, 60*time.Second)

		// The relay's retry produces x again (same dedup id) in a later batch,
		// and z twice in a row (likely one batch); marker comes last.
		again := b.record("a", "order.created", 1, `{"x":1}`)
		again.Headers = x.Headers
		z := b.record("a", "order.created", 2, `{"z":1}`)
		zAgain := b.record("a", "order.created", 2, `{"z":1}`)
		zAgain.Headers = z.Headers
		marker := b.record("a", "order.created", 3, `{"marker":1}`)
		b.produce(t, again, z, zAgain, marker)

		b.waitDeliveries(t, 6, 60*time.Second)
		testkit.Eventually(t, 30*time.Second, func() string {
			s := c.Stats()
			return testkit.Unless(s.Records == 5, "stats %+v", s)
		})
		for _, r := range []*kgo.Record{x, z, marker} {
			id, _ := header(r, contract.HeaderDedupID)
			if got := b.count(t, `SELECT count(*) FROM bridge.deliveries WHERE event_id = $1`, id); got != 2 {
				t.Errorf("event %s has %d deliveries, want 2 (one per subscription)", id, got)
			}
		}
		if s := c.Stats(); s.Duplicates != 2 || s.Deliveries != 6 {
			t.Errorf("stats = %+v, want 2 duplicates and 6 deliveries", s)
		}
	})
}

func TestBadRecordGoesToDLQAndPartitionKeepsFlowing(t *testing.T) {
	runSuite(t, 1, func(t *testing.T, b *testBundle) {
		b.createTopic(t, b.topic+contract.DeadLetterSuffix, 1)
		b.subscribe(t, []string{"*"}, nil, true)

		good1 := b.record("a", "order.created", 1, `{"i":1}`)
		notJSON := b.record("a", "order.created", 2, `this is not json`)
		badSeq := b.record("a", "order.created", 3, `{"i":3}`)
		badSeq.Headers[2].Value = []byte("three")
		nul := b.record("a", "order.created", 4, `{"s":"\u0000"}`) // valid JSON that jsonb refuses
		noType := b.record("a", "", 5, `{"i":5}`)
		good2 := b.record("a", "order.created", 6, `{"i":6}`)
		good3 := b.record("b", "order.updated", 1, `{"i":7}`)
		b.produce(t, good1, notJSON, badSeq, nul, noType, good2, good3)

		c := b.newConsumer(t, nil)
		stop, _ := start(t, c)
		b.waitDeliveries(t, 3, 60*time.Second)
		for _, r := range []*kgo.Record{good1, good2, good3} {
			id, _ := header(r, contract.HeaderDedupID)
			if b.count(t, `SELECT count(*) FROM bridge.deliveries WHERE event_id = $1`, id) != 1 {
				t.Errorf("record at offset %d has no delivery", r.Offset)
			}
		}

		dead := kafkatest.ConsumeAll(t, b.brokers, b.topic+contract.DeadLetterSuffix, 4, 30*time.Second)
		if len(dead) != 4 {
			t.Fatalf("%d records in %s, want 4", len(dead), b.topic+contract.DeadLetterSuffix)
		}
		wantReason := map[int64]string{
			notJSON.Offset: "value is not valid JSON",
			badSeq.Offset:  `asset-seq header "three" is not a non-negative decimal integer`,
			nul.Offset:     "PostgreSQL rejected the record: ",
			noType.Offset:  "no event-type header",
		}
		byOffset := map[int64]*kgo.Record{notJSON.Offset: notJSON, badSeq.Offset: badSeq, nul.Offset: nul, noType.Offset: noType}
		for _, d := range dead {
			offStr, _ := header(d, contract.HeaderDLQOffset)
			var off int64
			fmt.Sscan(offStr, &off)
			orig, ok := byOffset[off]
			if !ok {
				t.Errorf("unexpected dead letter for offset %q", offStr)
				continue
			}
			reason, _ := header(d, contract.HeaderDLQReason)
			if !strings.HasPrefix(reason, wantReason[off]) {
				t.Errorf("offset %d: dlq-reason %q, want prefix %q", off, reason, wantReason[off])
			}
			if src, _ := header(d, contract.HeaderDLQTopic); src != b.topic {
				t.Errorf("offset %d: dlq-topic %q", off, src)
			}
			if string(d.Key) != string(orig.Key) || string(d.Value) != string(orig.Value) {
				t.Errorf("offset %d: dead letter %q=%q, want the original %q=%q", off, d.Key, d.Value, orig.Key, orig.Value)
			}
			for _, h := range orig.Headers {
				if v, _ := header(d, h.Key); v != string(h.Value) {
					t.Errorf("offset %d: header %s = %q, want the original %q", off, h.Key, v, h.Value)
				}
			}
		}

		// The partition is committed past the bad records.
		testkit.Eventually(t, 30*time.Second, func() string {
			off := b.committed(t)
			return testkit.Unless(off[0] == 7, "committed %v", off)
		})
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if s := c.Stats(); s.DeadLettered != 4 || s.Deliveries != 3 || s.Records != 7 {
			t.Errorf("stats = %+v, want 4 dead-lettered, 3 deliveries, 7 records", s)
		}
		if n := b.count(t, `SELECT count(*) FROM bridge.consumer_inbox`); n != 3 {
			t.Errorf("inbox rows = %d, want 3 (dead letters never enter the inbox)", n)
		}
	})
}

func TestMissingDedupIDFallsBackToTopicPartitionOffset(t *testing.T) {
	runSuite(t, 2, func(t *testing.T, b *testBundle) {
		b.subscribe(t, []string{"*"}, nil, true)
		foreign := &kgo.Record{
			Topic: b.topic, Key: []byte("asset-9"), Value: []byte(`{"foreign":true}`),
			Headers: []kgo.RecordHeader{{Key: contract.HeaderEventType, Value: []byte("thing.happened")}},
		}
		b.produce(t, foreign)
		c := b.newConsumer(t, nil)
		start(t, c)
		b.waitDeliveries(t, 1, 60*time.Second)

		want := fmt.Sprintf("%s/%d/%d", b.topic, foreign.Partition, foreign.Offset)
		var eventID string
		var assetSeq *int64
		if err := b.db.Pool.QueryRow(context.Background(), `SELECT event_id, asset_seq FROM bridge.deliveries`).Scan(&eventID, &assetSeq); err != nil {
			t.Fatal(err)
		}
		if eventID != want || assetSeq != nil {
			t.Errorf("event_id = %q, asset_seq = %v; want %q and NULL", eventID, assetSeq, want)
		}
		if n := b.count(t, `SELECT count(*) FROM bridge.consumer_inbox WHERE dedup_id = $1 AND topic = $2 AND kafka_partition = $3 AND kafka_offset = $4`,
			want, b.topic, foreign.Partition, foreign.Offset); n != 1 {
			t.Errorf("inbox row for %s missing", want)
		}
	})
}

func TestPerAssetOrderMatchesAssetSeqAcrossPartitions(t *testing.T) {
	runSuite(t, 4, func(t *testing.T, b *testBundle) {
		b.subscribe(t, []string{"*"}, nil, true)
		b.subscribe(t, []string{"asset.*"}, nil, true)
		const assets, perAsset = 30, 20
		var recs []*kgo.Record
		for seq := int64(1); seq <= perAsset; seq++ {
			for a := range assets {
				recs = append(recs, b.record(fmt.Sprintf("asset-%02d", a), "asset.changed", seq, fmt.Sprintf(`{"seq":%d}`, seq)))
			}
			recs = append(recs, b.record("", "asset.changed", seq, `{}`)) // the null-asset stream
		}
		b.produce(t, recs...)
		// Small batches: order must hold across many transactions.
		c := b.newConsumer(t, func(cfg *Config) { cfg.MaxPollRecords = 37 })
		start(t, c)
		b.waitDeliveries(t, 2*len(recs), 90*time.Second)

		rows, err := b.db.Pool.Query(context.Background(),
			`SELECT subscription_id::text, coalesce(asset_id, '<null>'), asset_seq FROM bridge.deliveries ORDER BY seq`)
		if err != nil {
			t.Fatal(err)
		}
		last := map[string]int64{}
		var streams int
		for rows.Next() {
			var sub, asset string
			var seq int64
			if err := rows.Scan(&sub, &asset, &seq); err != nil {
				t.Fatal(err)
			}
			k := sub + "/" + asset
			if seq != last[k]+1 {
				t.Errorf("stream %s: asset_seq %d follows %d in delivery seq order", k, seq, last[k])
			}
			if last[k] == 0 {
				streams++
			}
			last[k] = seq
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if streams != 2*(assets+1) {
			t.Errorf("%d streams, want %d", streams, 2*(assets+1))
		}
		if s := c.Stats(); s.Batches < 2 {
			t.Errorf("only %d batches: the test did not exercise order across transactions", s.Batches)
		}
	})
}

func TestPruneRemovesOnlyOldInboxRows(t *testing.T) {
	runSuite(t, 1, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		_, err := b.db.Pool.Exec(ctx, `
			INSERT INTO bridge.consumer_inbox (dedup_id, topic, kafka_partition, kafka_offset, received_at)
			SELECT 'old-' || i, 't', 0, i, now() - interval '8 days' - i * interval '1 second' FROM generate_series(1, 23) i
			UNION ALL
			SELECT 'recent-' || i, 't', 0, i, now() - interval '6 days' FROM generate_series(1, 5) i`)
		if err != nil {
			t.Fatal(err)
		}
		// A batch smaller than the backlog: pruning must loop.
		c := b.newConsumer(t, func(cfg *Config) {
			cfg.DedupWindow = 7 * 24 * time.Hour
			cfg.PruneBatch = 5
			cfg.PruneInterval = 50 * time.Millisecond
		})
		start(t, c)
		// The counter moves just after each batch's delete commits: wait for
		// both, then check it did not count more.
		testkit.Eventually(t, 30*time.Second, func() string {
			n := b.count(t, `SELECT count(*) FROM bridge.consumer_inbox WHERE dedup_id LIKE 'old-%'`)
			return testkit.Unless(n == 0 && c.Stats().InboxPruned >= 23, "%d old rows left, %d counted pruned", n, c.Stats().InboxPruned)
		})
		if n := b.count(t, `SELECT count(*) FROM bridge.consumer_inbox WHERE dedup_id LIKE 'recent-%'`); n != 5 {
			t.Errorf("%d recent rows left, want 5", n)
		}
		if s := c.Stats(); s.InboxPruned != 23 {
			t.Errorf("InboxPruned = %d, want 23", s.InboxPruned)
		}
		if n, err := c.PruneInbox(ctx); err != nil || n != 0 {
			t.Errorf("PruneInbox again = %d, %v; want 0, nil", n, err)
		}
	})
}

func TestRebalanceWhenSecondMemberJoinsLosesAndDuplicatesNothing(t *testing.T) {
	runSuite(t, 6, func(t *testing.T, b *testBundle) {
		b.subscribe(t, []string{"*"}, nil, true)
		b.subscribe(t, []string{"item.*"}, nil, true)
		const assets, perAsset = 40, 60 // 2400 records over about 6s
		// While the second member joins, the first member's batches spend 1.5s
		// between their transaction and their offset commit (slow work,
		// simulated), so the rebalance lands in that window. Without
		// BlockRebalanceOnPoll a partition then moves with its old commit and the
		// second member processes those records again (this test saw Duplicates
		// > 0 in about half its runs with the option removed); with it, the
		// rebalance waits for the commit.
		var joining atomic.Bool
		slow := func([]*kgo.Record) error {
			if joining.Load() {
				time.Sleep(1500 * time.Millisecond)
			}
			return nil
		}
		first := b.newConsumer(t, func(cfg *Config) { cfg.MaxPollRecords = 50 })
		first.beforeCommit = slow
		start(t, first)

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		produced := make(chan error, 1)
		go func() {
			for seq := int64(1); seq <= perAsset; seq++ {
				var recs []*kgo.Record
				for a := range assets {
					recs = append(recs, b.record(fmt.Sprintf("asset-%02d", a), "item.changed", seq, fmt.Sprintf(`{"seq":%d}`, seq)))
				}
				if err := b.producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
					produced <- err
					return
				}
				if !service.Sleep(ctx, 100*time.Millisecond) {
					produced <- ctx.Err()
					return
				}
			}
			produced <- nil
		}()

		testkit.Eventually(t, 60*time.Second, func() string {
			n := first.Stats().Records
			return testkit.Unless(n > 200, "first member handled %d records", n)
		})
		second := b.newConsumer(t, func(cfg *Config) { cfg.MaxPollRecords = 50 })
		joining.Store(true)
		start(t, second)
		time.AfterFunc(5*time.Second, func() { joining.Store(false) })
		if err := <-produced; err != nil {
			t.Fatalf("produce: %v", err)
		}
		const n = assets * perAsset
		b.waitDeliveries(t, 2*n, 120*time.Second)

		// A batch's records are counted just after its transaction commits,
		// so the deliveries can be visible a moment before the counters.
		var s1, s2 Stats
		testkit.Eventually(t, 10*time.Second, func() string {
			s1, s2 = first.Stats(), second.Stats()
			return testkit.Unless(s1.Records+s2.Records >= n, "members handled %d of %d records", s1.Records+s2.Records, n)
		})
		t.Logf("first member: %+v; second member: %+v", s1, s2)
		if s2.Records == 0 {
			t.Fatal("the second member never got a partition: no rebalance was exercised")
		}
		if dups := s1.Duplicates + s2.Duplicates; dups != 0 {
			t.Errorf("%d records processed twice across the rebalance, want 0", dups)
		}
		if handled := s1.Records + s2.Records; handled != n {
			t.Errorf("members handled %d records, want %d", handled, n)
		}
		if inbox := b.count(t, `SELECT count(*) FROM bridge.consumer_inbox`); inbox != n {
			t.Errorf("inbox rows = %d, want %d", inbox, n)
		}
		if bad := b.count(t, `SELECT count(*) FROM (SELECT event_id FROM bridge.deliveries GROUP BY event_id HAVING count(*) <> 2) x`); bad != 0 {
			t.Errorf("%d events without exactly 2 deliveries", bad)
		}
		// Order survived the handover too.
		if bad := b.count(t, `
			SELECT count(*) FROM (
			  SELECT asset_seq - lag(asset_seq) OVER (PARTITION BY subscription_id, asset_id ORDER BY seq) AS step
			  FROM bridge.deliveries) x
			WHERE step <> 1`); bad != 0 {
			t.Errorf("%d deliveries out of asset order", bad)
		}
	})
}

func TestShutdownFinishesAndCommitsTheBatchInFlightThenLeavesTheGroup(t *testing.T) {
	runSuite(t, 1, func(t *testing.T, b *testBundle) {
		b.subscribe(t, []string{"*"}, nil, true)
		var recs []*kgo.Record
		for i := range 10 {
			recs = append(recs, b.record("a", "order.created", int64(i+1), `{}`))
		}
		b.produce(t, recs...)

		// SIGTERM arrives while the first batch is between its transaction and
		// its offset commit.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c := b.newConsumer(t, func(cfg *Config) { cfg.MaxPollRecords = 4 })
		var inFlight int
		c.beforeCommit = func(batch []*kgo.Record) error {
			if inFlight == 0 {
				inFlight = len(batch)
				cancel()
			}
			return nil
		}
		if err := c.Run(ctx); err != nil {
			t.Fatalf("Run = %v on graceful shutdown, want nil", err)
		}
		if inFlight == 0 {
			t.Fatal("no batch was in flight")
		}
		if off := b.committed(t); off[0] != int64(inFlight) {
			t.Errorf("committed offset %d, want %d (the batch in flight, and nothing polled after the signal)", off[0], inFlight)
		}
		if n := b.deliveries(t); n != inFlight {
			t.Errorf("%d deliveries, want %d", n, inFlight)
		}
		cl := kafkatest.Client(t, b.brokers)
		groups, err := kadm.NewClient(cl).DescribeGroups(context.Background(), b.group)
		if err != nil {
			t.Fatal(err)
		}
		if g := groups[b.group]; g.State != "Empty" || len(g.Members) != 0 {
			t.Errorf("group state %q with %d members after Run returned, want Empty (left)", g.State, len(g.Members))
		}
	})
}
