package relay

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/outboxstore"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/outbox"
)

// 1. "Publish this version and expire the old one" is one transaction with two
// events for one asset; they must reach Kafka in enqueue order (the created_at
// tie, docs/failure-modes.md §9).
func TestSameTransactionOrdering(t *testing.T) {
	runSuite(t, func(t *testing.T, b *testBundle) {
		topic := kafkatest.CreateTopic(t, b.brokers, 6, nil)
		b.startRelay(fastConfig())

		const txs = 1000
		ctx := context.Background()
		for i := range txs {
			asset := fmt.Sprintf("asset-%d", i%20)
			err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				if _, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: topic, AssetID: asset, EventType: "asset.version_published", Payload: payload(map[string]int{"v": i + 1})}); err != nil {
					return err
				}
				_, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: topic, AssetID: asset, EventType: "asset.version_expired", Payload: payload(map[string]int{"v": i})})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		b.waitAllSent(2*txs, 2*time.Minute)
		recs := kafkatest.ConsumeAll(t, b.brokers, topic, 2*txs, time.Minute)
		perKey := checkKeyOrder(t, recs)
		// Within each key, events alternate published, expired, published, ...
		for _, r := range recs {
			_ = r
		}
		for k, seqs := range perKey {
			if len(seqs) != 2*txs/20 {
				t.Fatalf("key %s: %d events, want %d", k, len(seqs), 2*txs/20)
			}
		}
		types := map[string][]string{}
		for _, r := range recs {
			types[string(r.Key)] = append(types[string(r.Key)], header(r, "event-type"))
		}
		for k, ts := range types {
			for i, typ := range ts {
				want := "asset.version_published"
				if i%2 == 1 {
					want = "asset.version_expired"
				}
				if typ != want {
					t.Fatalf("key %s position %d: %s, want %s", k, i, typ, want)
				}
			}
		}
	})
}

// 2. Concurrent transactions on the same assets: Kafka order per key equals
// asset_seq order with no gaps (enqueue serialises one asset's writers).
func TestConcurrentTransactionsOneAsset(t *testing.T) {
	runSuite(t, func(t *testing.T, b *testBundle) {
		topic := kafkatest.CreateTopic(t, b.brokers, 3, nil)
		b.startRelay(fastConfig())

		const writers, perWriter, assets = 8, 500, 5
		ctx := context.Background()
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perWriter {
					asset := fmt.Sprintf("hot-%d", (w+i)%assets)
					err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
						_, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: topic, AssetID: asset, EventType: "asset.touched", Payload: payload(map[string]int{"w": w, "i": i})})
						return err
					})
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		total := writers * perWriter
		b.waitAllSent(total, 2*time.Minute)
		recs := kafkatest.ConsumeAll(t, b.brokers, topic, total, time.Minute)
		perKey := checkKeyOrder(t, recs)
		n := 0
		for _, s := range perKey {
			n += len(s)
		}
		if n != total || len(perKey) != assets {
			t.Fatalf("got %d distinct events over %d keys, want %d over %d", n, len(perKey), total, assets)
		}
	})
}

// 3. The test a relay without an attempts counter never has
// (docs/failure-modes.md §10): a row that can never be sent is FAILED after
// exactly MaxAttempts attempts; other assets flow meanwhile; the later rows of
// its own asset go out after it is parked.
func TestPermanentFailureParksAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Fake(t)
	brokers := cluster.ListenAddrs()
	b := setup(t, brokers)
	poisonTopic, goodTopic := "poison-topic", "good-topic"
	for _, tp := range []string{poisonTopic, goodTopic} {
		if err := cluster.CreateTopic(tp, 3, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Every produce to the poison topic fails with a retriable error.
	cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: poisonTopic, Err: kerr.NotEnoughReplicas, Count: -1})

	cfg := fastConfig()
	cfg.MaxAttempts = 4
	cfg.ProduceTimeout = time.Second
	cfg.BackoffBase = 100 * time.Millisecond
	poisonID := b.enqueue(outbox.Event{Topic: poisonTopic, AssetID: "P", EventType: "asset.created", Payload: payload(1)})[0]
	behindID := b.enqueue(outbox.Event{Topic: goodTopic, AssetID: "P", EventType: "asset.updated", Payload: payload(2)})[0]
	b.startRelay(cfg)

	// Other assets keep flowing while P's row is retried.
	var others []uuid.UUID
	for i := range 20 {
		others = append(others, b.enqueue(outbox.Event{Topic: goodTopic, AssetID: fmt.Sprintf("other-%d", i), EventType: "asset.created", Payload: payload(i)})...)
		time.Sleep(20 * time.Millisecond)
	}
	// Other assets' rows go out while the poison row is still being
	// retried (seen SENT while it is not FAILED yet).
	sentWhileRetried := 0
	testkit.Eventually(t, 30*time.Second, func() string {
		r := b.row(poisonID)
		if r.Status != "FAILED" {
			n := 0
			for _, id := range others {
				if b.row(id).Status == "SENT" {
					n++
				}
			}
			sentWhileRetried = max(sentWhileRetried, n)
		}
		return testkit.Unless(r.Status == "FAILED", "poison row FAILED: %s", fmt.Sprintf("%+v", r))
	})
	poison := b.row(poisonID)
	if poison.Attempts != cfg.MaxAttempts {
		t.Fatalf("poison row attempts = %d, want exactly %d", poison.Attempts, cfg.MaxAttempts)
	}
	if poison.LastError == "" {
		t.Fatal("poison row has no last_error")
	}
	testkit.Eventually(t, 10*time.Second, func() string {
		r := b.row(behindID)
		return testkit.Unless(r.Status == "SENT", "row behind the poison sent: %s", r.Status)
	})
	behind := b.row(behindID)
	if behind.Attempts != 0 {
		t.Fatalf("row behind the poison was charged %d attempts", behind.Attempts)
	}
	if !behind.SentAt.After(*poison.FailedAt) {
		t.Fatalf("row behind the poison sent at %v, before the poison was parked at %v", behind.SentAt, poison.FailedAt)
	}
	for _, id := range others {
		r := b.row(id)
		if r.Status != "SENT" || r.Attempts != 0 {
			t.Fatalf("other asset row %s: %+v", id, r)
		}
	}
	if sentWhileRetried == 0 {
		t.Fatal("no other asset's row was sent while the poison row was being retried")
	}
}

// 4. A transient failure: produce fails for three relay attempts, then
// recovers. The row is SENT with attempts = 3 and nothing is FAILED.
func TestTransientFailureRecovers(t *testing.T) {
	topic := "flaky"
	cluster, b := setupFake(t, topic, 1)
	var failing atomic.Bool
	failing.Store(true)
	h := cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotEnoughReplicas, Count: -1,
		When: func(kmsg.Request) bool { return failing.Load() }})
	defer h.Remove()

	cfg := fastConfig()
	cfg.ProduceTimeout = time.Second
	cfg.BackoffBase = 200 * time.Millisecond
	id := b.enqueue(outbox.Event{Topic: topic, AssetID: "A", EventType: "asset.created", Payload: payload(1)})[0]
	b.startRelay(cfg)
	testkit.Eventually(t, 30*time.Second, func() string {
		r := b.row(id)
		return testkit.Unless(r.Attempts >= 3, "three charged attempts: %s", fmt.Sprintf("%+v", r))
	})
	failing.Store(false)
	testkit.Eventually(t, 10*time.Second, func() string {
		r := b.row(id)
		return testkit.Unless(r.Status == "SENT", "row SENT: %s", fmt.Sprintf("%+v", r))
	})
	if r := b.row(id); r.Attempts != 3 {
		t.Fatalf("attempts = %d, want 3", r.Attempts)
	}
	if c := b.countStatus(); c["FAILED"] != 0 {
		t.Fatalf("rows FAILED: %v", c)
	}
}

func incompressible(n int) string {
	buf := make([]byte, n)
	_, _ = rand.Read(buf)
	return base64.StdEncoding.EncodeToString(buf)[:n]
}

// 5. A record larger than the topic accepts is parked after one attempt with
// a reason naming its size; its batch neighbours are SENT.
func TestOversizedRecordParksImmediately(t *testing.T) {
	runSuite(t, func(t *testing.T, b *testBundle) {
		limit := "2000"
		topic := kafkatest.CreateTopic(t, b.brokers, 1, map[string]*string{"max.message.bytes": &limit})
		var events []outbox.Event
		for i := range 10 {
			events = append(events, outbox.Event{Topic: topic, AssetID: fmt.Sprintf("n-%d", i), EventType: "small", Payload: payload(i)})
		}
		big := outbox.Event{Topic: topic, AssetID: "big", EventType: "huge", Payload: payload(incompressible(20000))}
		events = append(events[:5], append([]outbox.Event{big}, events[5:]...)...)
		events = append(events, outbox.Event{Topic: topic, AssetID: "big", EventType: "after-huge", Payload: payload("ok")})
		ids := b.enqueue(events...) // one transaction: one claim batch
		b.startRelay(fastConfig())
		bigID, afterID := ids[5], ids[len(ids)-1]
		testkit.Eventually(t, 30*time.Second, func() string {
			c := b.countStatus()
			return testkit.Unless(c["FAILED"] == 1 && c["SENT"] == len(ids)-1, "oversized row FAILED and neighbours SENT: %s", fmt.Sprint(c))
		})
		r := b.row(bigID)
		if r.Status != "FAILED" || r.Attempts != 1 {
			t.Fatalf("oversized row: %+v, want FAILED after 1 attempt", r)
		}
		if want := "record of "; !contains(r.LastError, want) || !contains(r.LastError, "MESSAGE_TOO_LARGE") {
			t.Fatalf("reason %q should name the size and MESSAGE_TOO_LARGE", r.LastError)
		}
		if a := b.row(afterID); a.Attempts != 0 {
			t.Fatalf("row after the oversized one was charged: %+v", a)
		}
	})
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// A payload over RELAY_MAX_MESSAGE_BYTES is parked without being sent.
func TestPayloadOverMaxMessageBytesParked(t *testing.T) {
	runSuite(t, func(t *testing.T, b *testBundle) {
		topic := kafkatest.CreateTopic(t, b.brokers, 1, nil)
		cfg := fastConfig()
		cfg.MaxMessageBytes = 100
		ids := b.enqueue(
			outbox.Event{Topic: topic, AssetID: "a", EventType: "big", Payload: payload(incompressible(500))},
			outbox.Event{Topic: topic, AssetID: "a", EventType: "small", Payload: payload(1)})
		b.startRelay(cfg)
		testkit.Eventually(t, 10*time.Second, func() string {
			c := b.countStatus()
			return testkit.Unless(c["FAILED"] == 1 && c["SENT"] == 1, "parked and sent: %s", fmt.Sprint(c))
		})
		if r := b.row(ids[0]); r.Status != "FAILED" || !contains(r.LastError, "RELAY_MAX_MESSAGE_BYTES") {
			t.Fatalf("big row: %+v", r)
		}
	})
}

// 6. A broker outage under load: zero rows FAILED, zero attempts charged, all
// rows SENT after it returns, order kept.
func TestBrokerOutageChargesNothing(t *testing.T) {
	topic := "outage"
	cluster, b := setupFake(t, topic, 3)
	cfg := fastConfig()
	cfg.MaxAttempts = 2 // an outage that charged attempts would park rows fast
	cfg.ProduceTimeout = time.Second
	var outages atomic.Int64
	cfg.Metrics = outageCounter{&outages}
	b.startRelay(cfg)

	var down atomic.Bool
	cluster.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if down.Load() {
			return nil, fmt.Errorf("broker is down"), true // closes the connection
		}
		return nil, nil, false
	})

	total := 0
	enqueueSome := func(n int) {
		for i := range n {
			b.enqueue(outbox.Event{Topic: topic, AssetID: fmt.Sprintf("a-%d", i%7), EventType: "e", Payload: payload(total)})
			total++
		}
	}
	enqueueSome(50)
	b.waitAllSent(total, 30*time.Second)

	down.Store(true)
	outageStart := time.Now()
	for time.Since(outageStart) < 30*time.Second {
		enqueueSome(5)
		time.Sleep(500 * time.Millisecond)
	}
	var charged int
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT coalesce(sum(attempts), 0) FROM bridge.outbox`).Scan(&charged); err != nil {
		t.Fatal(err)
	}
	c := b.countStatus()
	if charged != 0 || c["FAILED"] != 0 {
		t.Fatalf("during the outage: %d attempts charged, %v", charged, c)
	}
	// The relay saw the outage (its produce attempts returned and were
	// classified), rather than hanging inside produce.
	if outages.Load() == 0 {
		t.Fatal("the relay never reported an outage while the broker was down")
	}
	down.Store(false)
	returned := time.Now()
	b.waitAllSent(total, 30*time.Second)
	t.Logf("relay drained %d rows %s after the broker returned", total, time.Since(returned).Round(time.Millisecond))
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT coalesce(sum(attempts), 0) FROM bridge.outbox`).Scan(&charged); err != nil {
		t.Fatal(err)
	}
	if charged != 0 {
		t.Fatalf("%d attempts charged for an outage", charged)
	}
	recs := kafkatest.ConsumeAll(t, cluster.ListenAddrs(), topic, total, 30*time.Second)
	checkKeyOrder(t, recs)
}

// 7. A crash between produce and mark: the row is produced twice with one
// dedup-id, never lost.
func TestCrashBetweenProduceAndMark(t *testing.T) {
	runSuite(t, func(t *testing.T, b *testBundle) {
		topic := kafkatest.CreateTopic(t, b.brokers, 1, nil)
		ids := b.enqueue(outbox.Event{Topic: topic, AssetID: "x", EventType: "e", Payload: payload(1)})

		cfg := fastConfig()
		cfg.LeaseTimeout = time.Second
		var crashed atomic.Bool
		first := b.startRelayWithHook(cfg, func() bool { crashed.Store(true); return true })
		testkit.Eventually(t, 20*time.Second, func() string { return testkit.Unless(crashed.Load(), "first relay to crash after producing") })
		first.crash()
		if r := b.row(ids[0]); r.Status != "NEW" {
			t.Fatalf("row marked %s by a relay that crashed before marking", r.Status)
		}
		b.startRelay(cfg) // takes the lanes over once the dead lease expires
		b.waitAllSent(1, 20*time.Second)
		recs := kafkatest.ConsumeAll(t, b.brokers, topic, 2, 20*time.Second)
		if len(recs) != 2 {
			t.Fatalf("got %d records, want the row twice", len(recs))
		}
		created := b.createdAt(ids[0])
		for _, r := range recs {
			if header(r, "dedup-id") != ids[0].String() {
				t.Fatalf("copy with dedup-id %q, want %s", header(r, "dedup-id"), ids[0])
			}
			// Both copies carry the event's time, whatever their own
			// timestamps (the time of each produce).
			checkCreatedAt(t, r, created)
		}
	})
}

// 8. A rolled-back transaction is never produced.
func TestRolledBackNeverProduced(t *testing.T) {
	runSuite(t, func(t *testing.T, b *testBundle) {
		topic := kafkatest.CreateTopic(t, b.brokers, 1, nil)
		b.startRelay(fastConfig())
		ctx := context.Background()
		tx, err := b.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rolledBack, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: topic, AssetID: "x", EventType: "never", Payload: payload(1)})
		if err != nil {
			t.Fatal(err)
		}
		// Hold the transaction open across a relay poll, then roll back.
		time.Sleep(300 * time.Millisecond)
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		marker := b.enqueue(outbox.Event{Topic: topic, AssetID: "x", EventType: "marker", Payload: payload(2)})[0]
		recs := kafkatest.ConsumeAll(t, b.brokers, topic, 1, 20*time.Second)
		if len(recs) != 1 || header(recs[0], "dedup-id") != marker.String() {
			t.Fatalf("records: %d; first dedup-id %q; want only the marker", len(recs), header(recs[0], "dedup-id"))
		}
		if header(recs[0], "asset-seq") != "1" {
			t.Fatalf("marker asset-seq %q: the rolled-back event left a gap", header(recs[0], "asset-seq"))
		}
		_ = rolledBack
	})
}

// 9. Two and three replicas on one database, one killed mid-run: per-key
// order holds, every row SENT, the dead replica's lanes taken over within the
// lease timeout (plus one lease-upkeep tick).
func TestReplicasTakeOverFromKilledOne(t *testing.T) {
	for _, replicas := range []int{2, 3} {
		t.Run(fmt.Sprintf("replicas=%d", replicas), func(t *testing.T) {
			runSuite(t, func(t *testing.T, b *testBundle) {
				topic := kafkatest.CreateTopic(t, b.brokers, 6, nil)
				cfg := fastConfig()
				cfg.BatchSize = 50
				var rs []*runningRelay
				for range replicas {
					rs = append(rs, b.startRelay(cfg))
				}
				testkit.Eventually(t, 20*time.Second, func() string {
					total, each := 0, []int{}
					for _, r := range rs {
						n := len(r.relay.OwnedLanes())
						total += n
						each = append(each, n)
					}
					for _, n := range each {
						if n == 0 {
							return fmt.Sprintf("lanes spread over replicas: %s", fmt.Sprint(each))
						}
					}
					return testkit.Unless(total == LaneCount, "lanes spread over replicas: %s", fmt.Sprint(each))
				})
				const assets, perAsset = 100, 30
				enqueueRound := func(round int) {
					var evs []outbox.Event
					for a := range assets {
						evs = append(evs, outbox.Event{Topic: topic, AssetID: fmt.Sprintf("asset-%d", a), EventType: "e", Payload: payload(round)})
					}
					b.enqueue(evs...)
				}
				for round := range perAsset / 2 {
					enqueueRound(round)
				}
				victim := rs[0]
				victimLanes := victim.relay.OwnedLanes()
				victim.crash()
				killedAt := time.Now()
				for round := perAsset / 2; round < perAsset; round++ {
					enqueueRound(round)
				}
				total := assets * perAsset
				b.waitAllSent(total, 60*time.Second)
				allSentAt := time.Now()
				// When did the survivors hold every lane the victim had?
				var takenOver time.Duration
				testkit.Eventually(t, 10*time.Second, func() string {
					owned := map[int]bool{}
					for _, r := range rs[1:] {
						for _, l := range r.relay.OwnedLanes() {
							owned[l] = true
						}
					}
					for _, l := range victimLanes {
						if !owned[l] {
							return fmt.Sprintf("victim's lanes owned by survivors: %s", fmt.Sprintf("lane %d not yet taken", l))
						}
					}
					takenOver = time.Since(killedAt)
					return ""
				})
				// Every row was SENT (its lane's position past it) by now.
				lastSent := allSentAt
				limit := cfg.LeaseTimeout + cfg.LeaseTimeout/5 + time.Second
				if d := lastSent.Sub(killedAt); d > limit+5*time.Second {
					t.Fatalf("victim's rows drained %s after the kill, limit ~%s", d, limit)
				}
				t.Logf("victim's lanes owned by survivors within %s of the kill", takenOver.Round(time.Millisecond))
				recs := kafkatest.ConsumeAll(t, b.brokers, topic, total, time.Minute)
				if os.Getenv("RELAY_TEST_LOG") != "" {
					rows, _ := b.db.Pool.Query(context.Background(), `SELECT asset_id, seq, asset_seq, lane, sent_at, kafka_offset FROM bridge.outbox WHERE asset_id IN ('asset-59','asset-79') ORDER BY asset_id, asset_seq`)
					for rows.Next() {
						var a string
						var seq, aseq, off int64
						var lane int
						var sent time.Time
						_ = rows.Scan(&a, &seq, &aseq, &lane, &sent, &off)
						t.Logf("%s seq=%d aseq=%d lane=%d sent=%s off=%d", a, seq, aseq, lane, sent.Format("15:04:05.000"), off)
					}
					rows.Close()
					t.Logf("killed at %s", killedAt.Format("15:04:05.000"))
				}
				checkKeyOrder(t, recs)
			})
		})
	}
}

// 10. A FAILED row replayed after the fault is fixed is SENT, with the same
// dedup-id.
func TestReplayFailedRow(t *testing.T) {
	topic := "denied"
	cluster, b := setupFake(t, topic, 1)
	h := cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.TopicAuthorizationFailed, Count: -1})
	id := b.enqueue(outbox.Event{Topic: topic, AssetID: "a", EventType: "e", Payload: payload(1)})[0]
	b.startRelay(fastConfig())
	testkit.Eventually(t, 20*time.Second, func() string {
		r := b.row(id)
		return testkit.Unless(r.Status == "FAILED", "row parked: %s", fmt.Sprintf("%+v", r))
	})
	if r := b.row(id); r.Attempts != 1 || !contains(r.LastError, "TOPIC_AUTHORIZATION_FAILED") {
		t.Fatalf("authorization refusal should park at once with its reason: %+v", r)
	}
	h.Remove()
	replayed, _, err := outboxstore.ReplayIDs(context.Background(), b.db.Pool, []uuid.UUID{id})
	if err != nil || len(replayed) != 1 {
		t.Fatalf("replay: %v err=%v", replayed, err)
	}
	testkit.Eventually(t, 20*time.Second, func() string {
		r := b.row(id)
		return testkit.Unless(r.Status == "SENT", "replayed row SENT: %s", fmt.Sprintf("%+v", r))
	})
	recs := kafkatest.ConsumeAll(t, cluster.ListenAddrs(), topic, 1, 10*time.Second)
	if len(recs) != 1 || header(recs[0], "dedup-id") != id.String() {
		t.Fatalf("replayed record missing or wrong: %d records", len(recs))
	}
}

// 11. Null-asset events from concurrent transactions form one ordered stream
// on one partition.
func TestNullAssetStreamOrdered(t *testing.T) {
	runSuite(t, func(t *testing.T, b *testBundle) {
		topic := kafkatest.CreateTopic(t, b.brokers, 4, nil)
		b.startRelay(fastConfig())
		const writers, each = 4, 50
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					b.enqueue(outbox.Event{Topic: topic, EventType: "system.tick", Payload: payload(w*1000 + i)})
				}
			}()
		}
		wg.Wait()
		b.waitAllSent(writers*each, time.Minute)
		recs := kafkatest.ConsumeAll(t, b.brokers, topic, writers*each, 30*time.Second)
		for _, r := range recs {
			if r.Key == nil || len(r.Key) != 0 {
				t.Fatalf("null-asset record key = %v, want empty non-nil", r.Key)
			}
		}
		if parts := byPartition(recs); len(parts) != 1 {
			t.Fatalf("null-asset stream spread over %d partitions", len(parts))
		}
		checkKeyOrder(t, recs)
	})
}

// The record carries the contract's headers and value.
func TestRecordShape(t *testing.T) {
	runSuite(t, func(t *testing.T, b *testBundle) {
		topic := kafkatest.CreateTopic(t, b.brokers, 1, nil)
		ctx := context.Background()
		var id uuid.UUID
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			var err error
			_, err = tx.Exec(ctx, `SELECT 1`)
			if err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT bridge.enqueue($1, 'asset-1', 'asset.created', '{"a":1}', '{"x-tenant":"t1","dedup-id":"spoof","created-at":"1999-01-01T00:00:00Z"}', '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')`, topic).Scan(&id)
		})
		if err != nil {
			t.Fatal(err)
		}
		b.startRelay(fastConfig())
		recs := kafkatest.ConsumeAll(t, b.brokers, topic, 1, 20*time.Second)
		if len(recs) != 1 {
			t.Fatalf("got %d records", len(recs))
		}
		r := recs[0]
		want := map[string]string{
			"dedup-id":     id.String(),
			"trace-id":     "0af7651916cd43dd8448eb211c80319c",
			"event-type":   "asset.created",
			"asset-seq":    "1",
			"content-type": "application/json",
			"x-tenant":     "t1",
		}
		for k, v := range want {
			if got := header(r, k); got != v {
				t.Errorf("header %s = %q, want %q", k, got, v)
			}
		}
		if tp := header(r, "traceparent"); len(tp) != 55 || tp[3:35] != "0af7651916cd43dd8448eb211c80319c" {
			t.Errorf("traceparent %q does not continue the stored trace", tp)
		}
		for _, name := range []string{"dedup-id", "created-at"} {
			n := 0
			for _, h := range r.Headers {
				if h.Key == name {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%d %s headers: a row header must not shadow the bridge's", n, name)
			}
		}
		checkCreatedAt(t, r, b.createdAt(id))
		if string(r.Key) != "asset-1" || string(r.Value) != `{"a": 1}` {
			t.Errorf("key %q value %q", r.Key, r.Value)
		}
		// The record can be read back before its lane's position is saved:
		// wait for it.
		b.waitAllSent(1, 20*time.Second)
		if row := b.row(id); row.Status != "SENT" {
			t.Errorf("row %+v not SENT once its record is in Kafka", row)
		}
	})
}

var _ = kgo.Record{}

// createdAt is the row's created_at as PostgreSQL keeps it.
func (b *testBundle) createdAt(id uuid.UUID) time.Time {
	b.t.Helper()
	var at time.Time
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT created_at FROM bridge.outbox WHERE id = $1`, id).Scan(&at); err != nil {
		b.t.Fatal(err)
	}
	return at
}

// checkCreatedAt: r's created-at header is want, RFC 3339 in UTC to the
// microsecond.
func checkCreatedAt(t *testing.T, r *kgo.Record, want time.Time) {
	t.Helper()
	got := header(r, "created-at")
	if got != want.UTC().Format(time.RFC3339Nano) {
		t.Errorf("created-at %q, want the row's created_at %s in UTC", got, want.UTC().Format(time.RFC3339Nano))
	}
}

// outageCounter counts the relay's outage reports.
type outageCounter struct{ n *atomic.Int64 }

func (outageCounter) Produced(string, time.Duration) {}
func (outageCounter) AttemptCharged(string)          {}
func (outageCounter) Parked(string, string)          {}
func (o outageCounter) Outage(active bool) {
	if active {
		o.n.Add(1)
	}
}

// Graceful shutdown mid-drain: Run returns nil, and every record that reached
// Kafka is marked SENT (the acks in flight were awaited and marked), so a
// restart produces nothing twice.
func TestGracefulShutdownMarksWhatWasProduced(t *testing.T) {
	runSuite(t, func(t *testing.T, b *testBundle) {
		topic := kafkatest.CreateTopic(t, b.brokers, 3, nil)
		const total = 40000
		var evs []outbox.Event
		for i := range total {
			evs = append(evs, outbox.Event{Topic: topic, AssetID: fmt.Sprintf("a-%d", i%50), EventType: "e", Payload: payload(i)})
		}
		b.enqueue(evs...)
		cfg := fastConfig()
		cfg.BatchSize = 200
		// The stop comes once the relay's client has 1,000 acks: waiting
		// for 1,000 rows SENT waited for a position save (at most once a
		// second), and by then a fast machine had drained all 40,000.
		acked := &ackCounter{}
		rr := b.startRelay(cfg, kgo.WithHooks(acked))
		testkit.Eventually(t, 30*time.Second, func() string {
			n := acked.n.Load()
			return testkit.Unless(n > 1000, "drain under way: %d acks", n)
		})
		if err := rr.stop(); err != nil {
			t.Fatalf("Run after SIGTERM-equivalent = %v, want nil", err)
		}
		c := b.countStatus()
		if c["SENT"] == total {
			t.Fatalf("the relay drained all %d rows before the stop arrived; the test needs a backlog left over", total)
		}
		var lanesHeld int
		if err := b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM bridge.relay_lanes WHERE owner IS NOT NULL`).Scan(&lanesHeld); err != nil {
			t.Fatal(err)
		}
		if lanesHeld != 0 {
			t.Fatalf("%d lanes still held after a graceful stop", lanesHeld)
		}
		recs := kafkatest.ConsumeAll(t, b.brokers, topic, c["SENT"], 20*time.Second)
		// Give any unmarked extra a moment to show up, then compare exactly.
		extra := kafkatest.ConsumeAll(t, b.brokers, topic, c["SENT"]+1, 2*time.Second)
		if len(recs) != c["SENT"] || len(extra) != c["SENT"] {
			t.Fatalf("Kafka holds %d (then %d) records, %d rows SENT: produced rows were left unmarked", len(recs), len(extra), c["SENT"])
		}
	})
}

// 14. The claim starts at the lowest seq it knows to be NEW, not at 0 (see
// outboxstore's claimSQL). A transaction that took its seq early and commits
// after the relay has moved past it — with later events relayed meanwhile —
// is still relayed, at once (its commit's notification lowers the floor),
// and so are rows replayed below the floor by each replay statement.
func TestRowsBecomingNewBelowTheFloorAreRelayed(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Fake(t)
	b := setup(t, cluster.ListenAddrs())
	for _, topic := range []string{"ok", "denied-a", "denied-b", "denied-c"} {
		if err := cluster.CreateTopic(topic, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	cfg := fastConfig()
	cfg.PollInterval = time.Hour // only the notifications can bring the floor down
	b.startRelay(cfg)
	ctx := context.Background()

	late, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	lateID, err := outbox.Enqueue(ctx, late, outbox.Event{Topic: "ok", AssetID: "late", EventType: "late", Payload: payload(0)})
	if err != nil {
		t.Fatal(err)
	}
	// Three committed transactions after it, each relayed before the next:
	// the floor passes the late row's seq.
	for i := range 3 {
		id := b.enqueue(outbox.Event{Topic: "ok", AssetID: fmt.Sprintf("on-time-%d", i), EventType: "e", Payload: payload(i)})[0]
		testkit.Eventually(t, 10*time.Second, func() string {
			return testkit.Unless(b.row(id).Status == "SENT", "on-time row %d SENT", i)
		})
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() string {
		return testkit.Unless(b.row(lateID).Status == "SENT", "late-committed row SENT: %+v", b.row(lateID))
	})

	// Park one row per replay statement, let the floor pass them, replay.
	var parked []uuid.UUID
	var faults []*kfake.FaultHandle
	for _, topic := range []string{"denied-a", "denied-b", "denied-c"} {
		faults = append(faults, cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.TopicAuthorizationFailed, Count: -1}))
		parked = append(parked, b.enqueue(outbox.Event{Topic: topic, AssetID: topic, EventType: "e", Payload: payload(1)})[0])
	}
	for _, id := range parked {
		testkit.Eventually(t, 10*time.Second, func() string {
			return testkit.Unless(b.row(id).Status == "FAILED", "row parked: %+v", b.row(id))
		})
	}
	for i := range 2 {
		id := b.enqueue(outbox.Event{Topic: "ok", AssetID: fmt.Sprintf("after-park-%d", i), EventType: "e", Payload: payload(i)})[0]
		testkit.Eventually(t, 10*time.Second, func() string {
			return testkit.Unless(b.row(id).Status == "SENT", "row after the parked ones SENT")
		})
	}
	for _, h := range faults {
		h.Remove()
	}
	if _, _, err := outboxstore.ReplayIDs(ctx, b.db.Pool, parked[:1]); err != nil {
		t.Fatal(err)
	}
	if _, err := outboxstore.ReplayAllFailed(ctx, b.db.Pool, "denied-b", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := outboxstore.ReplayFailedMatching(ctx, b.db.Pool, outboxstore.FailedFilter{Topic: "denied-c"}); err != nil {
		t.Fatal(err)
	}
	for i, id := range parked {
		testkit.Eventually(t, 10*time.Second, func() string {
			return testkit.Unless(b.row(id).Status == "SENT", "row replayed by statement %d SENT: %+v", i, b.row(id))
		})
	}
}

// A backlog read page by page, the next page read while the current one is
// produced: an asset whose sends fail mid-backlog is held behind its first
// failed row on every later page — whether the page was read before or
// after that failure was written — while every other asset flows, and once
// its sends succeed it goes out complete and in order.
func TestBacklogWithAFailingAssetKeepsItsOrder(t *testing.T) {
	cluster, b := setupFake(t, "flaky", 1)
	if err := cluster.CreateTopic("steady", 3, nil); err != nil {
		t.Fatal(err)
	}
	var failing atomic.Bool
	failing.Store(true)
	h := cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "flaky", Err: kerr.NotEnoughReplicas, Count: -1,
		When: func(kmsg.Request) bool { return failing.Load() }})
	defer h.Remove()

	const assets, rounds = 30, 40
	var first uuid.UUID
	for round := range rounds {
		var evs []outbox.Event
		for a := range assets {
			topic, asset := "steady", fmt.Sprintf("s-%d", a)
			if a == 0 {
				topic, asset = "flaky", "F"
			}
			evs = append(evs, outbox.Event{Topic: topic, AssetID: asset, EventType: "e", Payload: payload(round)})
		}
		ids := b.enqueue(evs...)
		if round == 0 {
			first = ids[0]
		}
	}
	cfg := fastConfig()
	cfg.BatchSize = 25 // 48 pages: the backlog is read ahead of its produce
	cfg.ProduceTimeout = time.Second
	b.startRelay(cfg)
	steady := (assets - 1) * rounds
	testkit.Eventually(t, 60*time.Second, func() string {
		r := b.row(first)
		return testkit.Unless(r.Attempts >= 2 && b.countStatus()["SENT"] == steady,
			"F's first row charged twice and every other asset's %d rows SENT: %+v, %v", steady, r, b.countStatus())
	})
	failing.Store(false)
	b.waitAllSent(assets*rounds, 60*time.Second)
	for _, topic := range []string{"flaky", "steady"} {
		want := rounds
		if topic == "steady" {
			want = steady
		}
		next := map[string]int{}
		seen := map[string]bool{}
		for _, rec := range kafkatest.ConsumeAll(t, b.brokers, topic, want, 20*time.Second) {
			if id := header(rec, "dedup-id"); seen[id] {
				continue // a copy sent again (at least once): the first one counts
			} else {
				seen[id] = true
			}
			seq, key := header(rec, "asset-seq"), string(rec.Key)
			if seq != fmt.Sprint(next[key]+1) {
				t.Fatalf("%s: key %s asset-seq %s after %d", topic, key, seq, next[key])
			}
			next[key]++
		}
	}
}

// ackCounter counts the acks the relay's client receives (a franz-go hook).
type ackCounter struct{ n atomic.Int64 }

func (a *ackCounter) OnProduceRecordUnbuffered(_ *kgo.Record, err error) {
	if err == nil {
		a.n.Add(1)
	}
}
