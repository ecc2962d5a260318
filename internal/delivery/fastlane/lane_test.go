package fastlane

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/webhooktest"
)

// The happy path: every delivery goes out from memory, in order per
// (subscription, asset), one request in flight per stream; PostgreSQL gets
// the attempt log only, and the committed offsets reach the end of the
// topic.
func TestFastLaneDeliversInOrderFromKafka(t *testing.T) {
	w := newWorld(t, 4, 3)
	w.recv.Respond = func(*webhooktest.Request) (int, time.Duration) { return http.StatusNoContent, 2 * time.Millisecond }
	l, _ := w.lane(t, nil)
	as := assets(20)
	w.produce(t, as, 10)
	want := len(w.subs) * len(as) * 10
	w.waitAccepted(t, want, 60*time.Second)
	w.checkClean(t)

	testkit.Eventually(t, 10*time.Second, func() string {
		c, end := w.committed(t)
		return testkit.Unless(c == end, "committed %d of end %d", c, end)
	})
	if n := w.count(t, `SELECT count(*)::int FROM bridge.deliveries`); n != 0 {
		t.Errorf("bridge.deliveries holds %d rows on the happy path, want 0", n)
	}
	testkit.Eventually(t, 10*time.Second, func() string {
		n := w.count(t, `SELECT count(*)::int FROM bridge.webhook_attempts WHERE status_code = 204`)
		return testkit.Unless(n == want, "attempt log holds %d successes, want %d", n, want)
	})
	if n := w.count(t, `SELECT count(*)::int FROM bridge.webhook_attempts WHERE response_body LIKE '%asset%'`); n != 0 {
		t.Errorf("attempt log holds %d payload-like bodies", n)
	}
	if st := l.Stats(); st.HandedOver != 0 || st.Delivered != int64(want) {
		t.Errorf("stats %+v: want %d delivered, none handed over", st, want)
	}
	// The gauges: every partition settled to its end, nothing held,
	// queued, in flight or parked.
	_, end := w.committed(t)
	testkit.Eventually(t, 10*time.Second, func() string {
		g := l.Gauges()
		var settled int64
		for _, p := range g.Partitions {
			if p.Settled == -1 && p.HighWatermark == -1 && p.Held == 0 {
				continue // no record on it: nothing known, nothing owed
			}
			if p.Lag != 0 || p.Held != 0 || p.Settled != p.HighWatermark {
				return fmt.Sprintf("partition %+v: want settled to its end, nothing held", p)
			}
			settled += p.Settled
		}
		return testkit.Unless(len(g.Partitions) == 4 && settled == end && g.Parked == 0 && g.Queued == 0 && g.InFlight == 0 && g.HeldBytes == 0,
			"gauges %+v: want 4 partitions settled to %d in all, nothing parked, queued, in flight or held", g, end)
	})
}

// A failing head parks its stream: it and every later event of the stream
// go to bridge.deliveries behind it, the slow lane retries them in order,
// and once the stream is empty the marker is gone and the next events go
// out from the fast lane again — with no reordering at either hand-over.
func TestFastLaneParksFailingStreamAndTakesItBack(t *testing.T) {
	w := newWorld(t, 4, 2)
	var refusals atomic.Int64
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		e := r.Envelope
		if r.Subscription == w.paths[1] && e.AssetID != nil && *e.AssetID == "asset-002" && *e.AssetSeq == 3 && r.Attempt <= 3 {
			refusals.Add(1)
			return http.StatusInternalServerError, 0
		}
		return http.StatusNoContent, time.Millisecond
	}
	l, _ := w.lane(t, nil)
	w.slowLane(t, nil)
	as := assets(5)
	w.produce(t, as, 10)
	w.waitAccepted(t, len(w.subs)*len(as)*10, 60*time.Second)
	w.checkClean(t)
	if refusals.Load() != 3 {
		t.Fatalf("the failing head was refused %d times, want 3", refusals.Load())
	}
	st := l.Stats()
	if st.Failed != 1 || st.HandedOver < 1 {
		t.Fatalf("stats %+v: want the one failure handed over", st)
	}
	// The head's four attempts: one in the fast lane's log, three in the
	// slow lane's row.
	if n := w.count(t, `SELECT attempts FROM bridge.deliveries WHERE subscription_id = $1 AND asset_id = 'asset-002' AND asset_seq = 3`,
		w.subs[1].ID); n != 4 {
		t.Errorf("the parked head's row has %d attempts, want 4 (1 fast + 3 slow)", n)
	}
	testkit.Eventually(t, 10*time.Second, func() string {
		n := w.count(t, `SELECT count(*)::int FROM bridge.delivery_parks`)
		return testkit.Unless(n == 0, "%d park markers left after the stream drained", n)
	})
	rows := w.count(t, `SELECT count(*)::int FROM bridge.deliveries`)

	// Back in the fast lane: the next events of that stream touch no row.
	w.produce(t, as, 5)
	w.waitAccepted(t, len(w.subs)*len(as)*15, 60*time.Second)
	w.checkClean(t)
	if n := w.count(t, `SELECT count(*)::int FROM bridge.deliveries`); n != rows {
		t.Errorf("bridge.deliveries grew from %d to %d rows after the stream came back", rows, n)
	}
	testkit.Eventually(t, 10*time.Second, func() string {
		c, end := w.committed(t)
		return testkit.Unless(c == end, "committed %d of end %d", c, end)
	})
}

// A partition moves to another member while one of its streams is parked:
// the new owner reads the marker on assignment and keeps queueing behind the
// parked rows, so order holds across the move and the hand-back.
func TestFastLaneRebalanceWhileParked(t *testing.T) {
	w := newWorld(t, 6, 2)
	var failing atomic.Bool
	failing.Store(true)
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		e := r.Envelope
		if failing.Load() && r.Subscription == w.paths[0] && e.AssetID != nil && *e.AssetID == "asset-003" {
			return http.StatusServiceUnavailable, 0
		}
		return http.StatusNoContent, time.Millisecond
	}
	_, stopA := w.lane(t, nil)
	// Retries every 300 ms for a minute: the stream stays parked (not dead)
	// while it fails.
	schedule := make([]time.Duration, 200)
	for i := range schedule {
		schedule[i] = 300 * time.Millisecond
	}
	w.slowLane(t, schedule)
	as := assets(12)
	w.produce(t, as, 5)
	testkit.Eventually(t, 30*time.Second, func() string {
		n := w.count(t, `SELECT count(*)::int FROM bridge.delivery_parks WHERE subscription_id = $1 AND asset_key = 'asset-003'`, w.subs[0].ID)
		return testkit.Unless(n == 1, "stream not parked yet")
	})
	lb, _ := w.lane(t, nil)
	w.produce(t, as, 5)
	stopA() // B owns every partition now
	w.produce(t, as, 5)
	// Everything but the parked stream arrives while it still fails.
	w.waitAccepted(t, len(w.subs)*len(as)*15-15, 60*time.Second)
	failing.Store(false)
	w.waitAccepted(t, len(w.subs)*len(as)*15, 60*time.Second)
	w.checkClean(t)
	testkit.Eventually(t, 10*time.Second, func() string {
		n := w.count(t, `SELECT count(*)::int FROM bridge.delivery_parks`)
		return testkit.Unless(n == 0, "%d park markers left", n)
	})
	w.produce(t, as, 2)
	w.waitAccepted(t, len(w.subs)*len(as)*17, 60*time.Second)
	w.checkClean(t)
	testkit.Eventually(t, 10*time.Second, func() string {
		c, end := w.committed(t)
		return testkit.Unless(c == end, "committed %d of end %d", c, end)
	})
	if st := lb.Stats(); st.Records == 0 {
		t.Errorf("member B read no records: %+v", st)
	}
}

// A member stopped in the middle of a drain (requests cut off, deliveries
// unsettled) loses nothing: the offset never passed an unsettled record, so
// the next member sends the rest, in order; only repeats of a webhook-id
// may appear.
func TestFastLaneRestartLosesNothing(t *testing.T) {
	w := newWorld(t, 4, 2)
	var delay atomic.Int64
	delay.Store(int64(20 * time.Millisecond))
	w.recv.Respond = func(*webhooktest.Request) (int, time.Duration) {
		return http.StatusNoContent, time.Duration(delay.Load())
	}
	_, stopA := w.lane(t, func(c *Config) { c.ShutdownGrace = time.Millisecond })
	as := assets(10)
	w.produce(t, as, 20)
	want := len(w.subs) * len(as) * 20
	w.waitAccepted(t, want/4, 60*time.Second)
	stopA()
	if got := w.recv.Stats().Accepted; got >= want {
		t.Fatalf("the first member delivered everything (%d) before it stopped; the test proves nothing", got)
	}
	delay.Store(0)
	w.lane(t, nil)
	w.waitAccepted(t, want, 60*time.Second)
	w.checkClean(t)
}

// A parked stream whose next record PostgreSQL refuses (a \u0000 in its
// JSON, which jsonb rejects): the hand-over isolates it, dead-letters it to
// "<topic>.dlq", and the rest of the stream goes behind the parked head and
// out in order; the offset is not held.
func TestFastLaneDeadLettersARecordPostgreSQLRefusesAtHandOver(t *testing.T) {
	w := newWorld(t, 2, 1)
	w.recv.Gapless = false // the refused event is a gap
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if e := r.Envelope; *e.AssetID == "asset-001" && *e.AssetSeq == 1 && r.Attempt <= 2 {
			return http.StatusInternalServerError, 0
		}
		return http.StatusNoContent, 0
	}
	l, _ := w.lane(t, nil)
	w.slowLane(t, nil)
	asset := "asset-001"
	var recs []*kgo.Record
	for seq := int64(1); seq <= 5; seq++ {
		payload := fmt.Appendf(nil, `{"n":%d}`, seq)
		if seq == 2 {
			payload = []byte(`{"n":"\u0000"}`)
		}
		recs = append(recs, contract.Encode(contract.Event{DedupID: uuid.NewString(), Topic: w.topic, AssetID: &asset,
			AssetSeq: seq, EventType: "asset.updated", Payload: payload, CreatedAt: time.Now()}))
	}
	// The head's failure must park the stream before seq 2 could be sent:
	// all five are produced at once and queue behind the head.
	if err := w.producer.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	w.waitAccepted(t, 4, 60*time.Second)
	w.checkClean(t)
	dlq := kafkatest.ConsumeAll(t, w.brokers, w.topic+contract.DeadLetterSuffix, 1, 30*time.Second)
	if got := string(dlq[0].Value); got != string(recs[1].Value) {
		t.Fatalf("dead letter %q, want the refused record %q", got, recs[1].Value)
	}
	// bridge_fastlane_dead_lettered_total counts it.
	if n := l.Stats().DeadLettered; n != 1 {
		t.Errorf("%d records counted as dead-lettered, want 1", n)
	}
	testkit.Eventually(t, 10*time.Second, func() string {
		c, end := w.committed(t)
		return testkit.Unless(c == end, "committed %d of end %d", c, end)
	})
	if n := w.count(t, `SELECT count(*)::int FROM bridge.deliveries WHERE asset_seq = 2`); n != 0 {
		t.Errorf("%d rows of the refused record", n)
	}
}

// One subscription answers in 2 s: it is isolated (handed to the slow lane
// as a whole on each partition), so the partitions' offsets reach the end
// of the topic long before its own deliveries are done, and every stream
// stays in order.
func TestFastLaneIsolatesASlowSubscription(t *testing.T) {
	w := newWorld(t, 2, 3)
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if r.Subscription == w.paths[0] {
			return http.StatusNoContent, 2 * time.Second
		}
		return http.StatusNoContent, 0
	}
	l, _ := w.lane(t, func(c *Config) { c.IsolateAfter = 300 * time.Millisecond })
	w.slowLane(t, nil)
	as := assets(10)
	w.produce(t, as, 5)
	started := time.Now()
	testkit.Eventually(t, 30*time.Second, func() string {
		c, end := w.committed(t)
		return testkit.Unless(c == end, "committed %d of end %d", c, end)
	})
	// The slow subscription's 10 streams × 5 events take ≥ 10 s one request
	// at a time per stream; the offsets must not have waited for them.
	if took := time.Since(started); took > 8*time.Second {
		t.Errorf("offsets reached the end after %s: they waited for the slow subscription", took)
	}
	if st := l.Stats(); st.HandedOver == 0 {
		t.Errorf("nothing handed to the slow lane: %+v", st)
	}
	w.waitAccepted(t, len(w.subs)*len(as)*5, 90*time.Second)
	w.checkClean(t)
}

// A subscription that falls behind the others without any request being
// slow enough to isolate it — here its in-flight cap against a 1-s
// endpoint — holds the partition's oldest record while the others have
// settled it: after HoldLimit it is handed to the slow lane on that
// partition, so the offsets do not wait for its backlog; order stays exact.
// The endpoint is slower than the others' requests by far more than
// slowerFactor even when -race and a loaded machine slow those to tens of
// milliseconds (at 150 ms a CI run isolated nothing).
func TestFastLaneIsolatesASubscriptionThatHoldsTheOffset(t *testing.T) {
	w := newWorld(t, 2, 3)
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if r.Subscription == w.paths[0] {
			return http.StatusNoContent, time.Second
		}
		return http.StatusNoContent, 0
	}
	l, _ := w.lane(t, func(c *Config) {
		c.MaxInFlightPerSubscription = 2
		c.HoldLimit = time.Second
	})
	w.slowLane(t, nil)
	as := assets(10)
	w.produce(t, as, 20)
	started := time.Now()
	testkit.Eventually(t, 30*time.Second, func() string {
		c, end := w.committed(t)
		return testkit.Unless(c == end, "committed %d of end %d", c, end)
	})
	// The lagging subscription's 200 deliveries take 100 s two at a time;
	// the offsets must not have waited for them.
	if took := time.Since(started); took > 9*time.Second {
		t.Errorf("offsets reached the end after %s: they waited for the lagging subscription", took)
	}
	if st := l.Stats(); st.HandedOver == 0 {
		t.Errorf("nothing handed to the slow lane: %+v", st)
	}
	w.waitAccepted(t, len(w.subs)*len(as)*20, 90*time.Second)
	w.checkClean(t)
}

// A subscription that is behind the others but under its in-flight cap is
// this member's capacity, not a subscription holding the offset: it is
// never handed to the slow lane, however long the partition's oldest
// record waits for it.
func TestFastLaneNeverIsolatesASubscriptionUnderItsCap(t *testing.T) {
	w := newWorld(t, 2, 3)
	w.recv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if r.Subscription == w.paths[0] {
			return http.StatusNoContent, 150 * time.Millisecond
		}
		return http.StatusNoContent, 0
	}
	l, _ := w.lane(t, func(c *Config) { c.HoldLimit = 500 * time.Millisecond })
	as := assets(10)
	w.produce(t, as, 20)
	// Each of the behind subscription's streams takes 20 × 150 ms one
	// request at a time: its head records wait ~3 s, six HoldLimits.
	w.waitAccepted(t, len(w.subs)*len(as)*20, 60*time.Second)
	w.checkClean(t)
	if st := l.Stats(); st.HandedOver != 0 {
		t.Errorf("%d deliveries handed to the slow lane: a subscription under its cap was isolated", st.HandedOver)
	}
	for _, p := range l.Gauges().Partitions {
		if p.Isolated != 0 {
			t.Errorf("partition %d: %d subscriptions isolated, want none", p.Partition, p.Isolated)
		}
	}
}

// Isolation compares a subscription with the others: when every endpoint is
// slow (or the machine is, for every request), requests in flight past
// IsolateAfter isolate no one — moving everything to PostgreSQL would only
// make the member slower.
func TestFastLaneIsolatesNoOneWhenEveryRequestIsSlow(t *testing.T) {
	w := newWorld(t, 2, 3)
	w.recv.Respond = func(*webhooktest.Request) (int, time.Duration) { return http.StatusNoContent, 400 * time.Millisecond }
	l, _ := w.lane(t, func(c *Config) { c.IsolateAfter = 300 * time.Millisecond })
	as := assets(10)
	w.produce(t, as, 12)
	w.waitAccepted(t, len(w.subs)*len(as)*12, 60*time.Second)
	w.checkClean(t)
	if st := l.Stats(); st.HandedOver != 0 || st.Delivered < minRequestsToJudge {
		t.Errorf("stats %+v: want every delivery from the fast lane (and enough of them to judge), none handed over", st)
	}
}
