package fastlane

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/webhooktest"
)

// An event the relay produced twice (its SENT mark lost) reaches the fast
// lane as two records with the same dedup-id and created-at but different
// record timestamps, other records between them (the relay re-produces the
// tail of a lane; only adjacent repeats are dropped). The fast lane has no
// inbox and posts both: the second
// must be the same signed body as the first, its timestamp the event's
// creation time. A record without created-at (produced before the header,
// or by another producer) goes out with its record timestamp.
func TestFastLaneReproducedEventHasTheSameBody(t *testing.T) {
	w := newWorld(t, 1, 1)
	var mu sync.Mutex
	bodies := map[string][][]byte{} // webhook-id → bodies of its 2xx requests
	w.recv.Observe = func(rq *webhooktest.Request) {
		if rq.Outcome != webhooktest.Accepted && rq.Outcome != webhooktest.Duplicate {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		bodies[rq.WebhookID] = append(bodies[rq.WebhookID], bytes.Clone(rq.Body))
	}
	w.lane(t, nil)

	asset := "asset-1"
	created := time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC) // microseconds, as PostgreSQL keeps them
	produced := time.Now().Truncate(time.Millisecond)               // Kafka keeps milliseconds
	ev := contract.Event{
		DedupID: uuid.NewString(), Topic: w.topic, AssetID: &asset, AssetSeq: 1,
		EventType: "asset.updated", Payload: []byte(`{"n":1}`), CreatedAt: created,
	}
	first, again := contract.Encode(ev), contract.Encode(ev)
	first.Timestamp, again.Timestamp = produced, produced.Add(7*time.Second)
	oldID := uuid.NewString()
	old := contract.Encode(contract.Event{
		DedupID: oldID, Topic: w.topic, AssetID: &asset, AssetSeq: 2,
		EventType: "asset.updated", Payload: []byte(`{"n":2}`),
	})
	old.Timestamp = produced.Add(5 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := w.producer.ProduceSync(ctx, first, old, again).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	testkit.Eventually(t, 60*time.Second, func() string {
		st := w.recv.Stats()
		return testkit.Unless(st.Accepted == 2 && st.Duplicates == 1,
			"receiver accepted %d, duplicates %d (requests %d); want 2 and the re-produced copy", st.Accepted, st.Duplicates, st.Requests)
	})
	w.checkClean(t)

	mu.Lock()
	defer mu.Unlock()
	copies := bodies[ev.DedupID]
	if len(copies) != 2 {
		t.Fatalf("%d acknowledged requests for the re-produced event, want 2", len(copies))
	}
	if !bytes.Equal(copies[0], copies[1]) {
		t.Errorf("the copies' bodies differ:\n%s\n%s", copies[0], copies[1])
	}
	env, err := contract.ParseEnvelope(copies[0])
	if err != nil {
		t.Fatal(err)
	}
	if want := "2026-03-01T12:00:00.123456Z"; env.Timestamp != want {
		t.Errorf("timestamp %q, want the event's creation time %q", env.Timestamp, want)
	}
	olds := bodies[oldID]
	if len(olds) != 1 {
		t.Fatalf("%d acknowledged requests for the record without created-at, want 1", len(olds))
	}
	env, err = contract.ParseEnvelope(olds[0])
	if err != nil {
		t.Fatal(err)
	}
	if want := old.Timestamp.UTC().Format(time.RFC3339Nano); env.Timestamp != want {
		t.Errorf("record without created-at: timestamp %q, want its record timestamp %q", env.Timestamp, want)
	}
}
