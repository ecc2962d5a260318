package relay

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/outbox"
)

// ackLog is a franz-go hook on the relay's own client: the outcome of every
// record, in the order the client reported them.
type ackLog struct {
	mu     sync.Mutex
	events []ackEvent
}

type ackEvent struct {
	key    string
	seq    int64
	dedup  string
	failed bool
}

func (l *ackLog) OnProduceRecordUnbuffered(r *kgo.Record, err error) {
	seq, _ := strconv.ParseInt(header(r, "asset-seq"), 10, 64)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, ackEvent{key: string(r.Key), seq: seq, dedup: header(r, "dedup-id"), failed: err != nil})
}

func (l *ackLog) snapshot() []ackEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// acked returns key's asset-seqs in the order their first ack came.
func (l *ackLog) acked(key string) []int64 {
	seen := map[string]bool{}
	var out []int64
	for _, e := range l.snapshot() {
		if e.key == key && !e.failed && !seen[e.dedup] {
			seen[e.dedup] = true
			out = append(out, e.seq)
		}
	}
	return out
}

// Batches overlap: the next one is claimed and produced while the acks of
// the one before it are outstanding. A row whose asset has a row in a batch
// still in flight waits for that row's fate; the other assets of its batch
// go out at once. When the earlier row fails, the later one is held behind
// it, uncharged, and goes out after it: its ack never comes first, though it
// goes to another topic (another partition) than the failing row.
func TestOverlappingBatchesKeepEachAssetsOrder(t *testing.T) {
	cluster, b := setupFake(t, "flaky", 1)
	if err := cluster.CreateTopic("steady", 3, nil); err != nil {
		t.Fatal(err)
	}
	var failing, refused sync.Once // stop refusing; the first refusal seen
	stop := make(chan struct{})
	refusedCh := make(chan struct{})
	h := cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "flaky", Err: kerr.NotEnoughReplicas, Count: -1,
		When: func(kmsg.Request) bool {
			select {
			case <-stop:
				return false
			default:
				refused.Do(func() { close(refusedCh) })
				return true
			}
		}})
	defer h.Remove()

	acks := &ackLog{}
	cfg := fastConfig()
	// The client retries F's refused first row until the delivery timeout:
	// its batch stays in flight this long.
	cfg.ProduceTimeout = 2 * time.Second
	cfg.BackoffBase = 100 * time.Millisecond
	b.startRelay(cfg, kgo.WithHooks(acks))

	first := b.enqueue(
		outbox.Event{Topic: "flaky", AssetID: "F", EventType: "e", Payload: payload(1)},
		outbox.Event{Topic: "steady", AssetID: "X", EventType: "e", Payload: payload(1)},
	)
	select {
	case <-refusedCh:
	case <-time.After(20 * time.Second):
		t.Fatal("F's first row was never produced")
	}
	// F's first row is in flight: its next row (to another topic) and
	// another asset's row commit now and are claimed in the next batch.
	later := b.enqueue(
		outbox.Event{Topic: "steady", AssetID: "F", EventType: "e", Payload: payload(2)},
		outbox.Event{Topic: "steady", AssetID: "O", EventType: "e", Payload: payload(1)},
	)
	head, behind := first[0], later[0]

	testkit.Eventually(t, 20*time.Second, func() string {
		return testkit.Unless(len(acks.acked("O")) == 1, "O's row acked")
	})
	for _, e := range acks.snapshot() {
		if e.key == "F" && e.failed {
			t.Fatal("O was acked only after F's first row failed: the next batch waited for the acks of the one before it")
		}
	}
	testkit.Eventually(t, 20*time.Second, func() string {
		r := b.row(head)
		return testkit.Unless(r.Attempts >= 1, "F's first row charged: %+v", r)
	})
	if got := acks.acked("F"); len(got) > 0 {
		t.Fatalf("F's acks while its first row fails: %v (its later row overtook it)", got)
	}
	if r := b.row(behind); r.Status != "NEW" {
		t.Fatalf("F's later row is %s while its first row fails, want NEW (held behind it)", r.Status)
	}

	failing.Do(func() { close(stop) })
	b.waitAllSent(4, 30*time.Second)
	if got := acks.acked("F"); !slices.Equal(got, []int64{1, 2}) {
		t.Fatalf("F's rows acked in the order %v, want [1 2]", got)
	}
	if r := b.row(behind); r.Attempts != 0 {
		t.Fatalf("F's later row was charged %d attempts; it only waited behind the failing one", r.Attempts)
	}
	if r := b.row(head); r.Attempts < 1 {
		t.Fatalf("F's first row has %d attempts", r.Attempts)
	}
	t.Logf("acks: %s", fmt.Sprint(acks.snapshot()))
}
