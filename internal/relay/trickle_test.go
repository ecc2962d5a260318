package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/outbox"
)

// The trickle rule (see Relay.trickle): under a steady load of one-event
// commits, far below a page each, the relay stays busy and its writers'
// commits skip their NOTIFY — every event is still relayed, in order per
// key, while only a few commits notify (the first ones, before the load is
// seen as steady). A relay that went to wait after every small claim made
// nearly every commit notify, and notifying commits queue for one another
// through their WAL flush.
func TestSteadyTrickleIsRelayedWithoutNotifications(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Fake(t)
	b := setup(t, cluster.ListenAddrs())
	const topic = "trickle"
	if err := cluster.CreateTopic(topic, 3, nil); err != nil {
		t.Fatal(err)
	}
	b.startRelay(fastConfig())
	ctx := context.Background()

	// Count the notifications the commits send, on a connection of the
	// test's own.
	listener, err := pgx.ConnectConfig(ctx, b.db.Pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = listener.Close(context.Background()) }()
	if _, err := listener.Exec(ctx, `LISTEN bridge_outbox`); err != nil {
		t.Fatal(err)
	}
	var notified atomic.Int64
	lctx, stopListening := context.WithCancel(ctx)
	listening := make(chan struct{})
	go func() {
		defer close(listening)
		for {
			if _, err := listener.WaitForNotification(lctx); err != nil {
				return
			}
			notified.Add(1)
		}
	}()

	// Two writers, one event per transaction, each every 4 ms for 2 s:
	// about 500 commits a second, a claim finding a few rows each.
	const writers, perWriter = 2, 500
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(4 * time.Millisecond)
			defer tick.Stop()
			for i := range perWriter {
				<-tick.C
				err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
					_, err := outbox.EnqueueBatch(ctx, tx, []outbox.Event{{Topic: topic,
						AssetID: fmt.Sprintf("asset-%d-%d", w, i%10), EventType: "trickle", Payload: payload(i)}})
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
	if err := errors.Join(<-errs); err != nil {
		t.Fatal(err)
	}
	const commits = writers * perWriter
	b.waitAllSent(commits, time.Minute)
	stopListening()
	<-listening
	checkKeyOrder(t, kafkatest.ConsumeAll(t, b.brokers, topic, commits, time.Minute))
	if n := notified.Load(); n > commits/4 {
		t.Fatalf("%d of %d commits notified the relay: a steady trickle must find it busy, not waiting for a NOTIFY", n, commits)
	}
	t.Logf("%d of %d commits notified", notified.Load(), commits)
}
