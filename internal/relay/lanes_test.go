package relay

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/outbox"
)

// Lanes change hands as soon as a replica joins or stops (LanesChannel), not
// at the next lease tick: before, a lane released for a joining replica sat
// unowned — its rows waiting — until that replica's next tick, and the
// replicas' sum fell below one replica's rate. The lease here is 30 s, so a
// tick comes every 6 s: every hand-over below must finish well inside one.
// Rows keep flowing throughout, and per-key order must stay exact; no lane
// is ever held by two replicas at once.
func TestLanesMovePromptlyWhenReplicasJoinAndStop(t *testing.T) {
	kafkatest.RunBackends(t, func(t *testing.T, be kafkatest.Backend) {
		b := setup(t, be.Brokers(t))
		topic := kafkatest.CreateTopic(t, b.brokers, 6, nil)
		cfg := fastConfig()
		cfg.LeaseTimeout = 30 * time.Second
		cfg.BatchSize = 50
		const promptly = 3 * time.Second // half a tick

		var mu sync.Mutex
		var rs []*runningRelay
		// spread waits until the running replicas hold want lanes each and
		// all 64 between them, checking on every look that no lane is held
		// by two, and returns how long it took.
		spread := func(want ...int) time.Duration {
			t.Helper()
			started := time.Now()
			testkit.Eventually(t, 20*time.Second, func() string {
				mu.Lock()
				defer mu.Unlock()
				holder := map[int]int{}
				each := []int{}
				for i, r := range rs {
					lanes := r.relay.OwnedLanes()
					each = append(each, len(lanes))
					for _, l := range lanes {
						if j, ok := holder[l]; ok {
							t.Fatalf("lane %d held by replicas %d and %d at once", l, j, i)
						}
						holder[l] = i
					}
				}
				return testkit.Unless(fmt.Sprint(each) == fmt.Sprint(want) && len(holder) == LaneCount,
					"lanes per replica %v (want %v)", each, want)
			})
			return time.Since(started)
		}
		start := func() {
			r := b.startRelay(cfg)
			mu.Lock()
			rs = append(rs, r)
			mu.Unlock()
		}

		// Writers enqueue rounds of one event per asset during every change.
		const assets = 50
		stop := make(chan struct{})
		var writers sync.WaitGroup
		var rounds int
		writers.Add(1)
		go func() {
			defer writers.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				var evs []outbox.Event
				for a := range assets {
					evs = append(evs, outbox.Event{Topic: topic, AssetID: fmt.Sprintf("asset-%d", a), EventType: "e", Payload: payload(rounds)})
				}
				b.enqueue(evs...)
				rounds++
			}
		}()

		start()
		spread(64)
		start()
		if d := spread(32, 32); d > promptly {
			t.Errorf("second replica joined: lanes spread after %s, want within %s", d.Round(time.Millisecond), promptly)
		}
		start()
		if d := spread(22, 22, 20); d > promptly {
			t.Errorf("third replica joined: lanes spread after %s, want within %s", d.Round(time.Millisecond), promptly)
		}
		stopped := rs[1]
		if err := stopped.stop(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		rs = []*runningRelay{rs[0], rs[2]}
		mu.Unlock()
		if d := spread(32, 32); d > promptly {
			t.Errorf("a replica stopped: its lanes taken over after %s, want within %s", d.Round(time.Millisecond), promptly)
		}
		close(stop)
		writers.Wait()

		total := rounds * assets
		b.waitAllSent(total, time.Minute)
		checkKeyOrder(t, kafkatest.ConsumeAll(t, b.brokers, topic, total, time.Minute))
	})
}
