package chaos

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/chaos/harness"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// The fast lane's park hand-over under faults (docs/architecture.md, "The
// park marker"): two `bridge deliver` members with WEBHOOK_FAST_LANE=true
// share the topic's partitions, a relay feeds it. The flaky subscription
// fails each event's first two attempts, so every one of its events parks
// its stream, goes to the slow lane, is retried there, and the stream comes
// back to the fast lane when its backlog is empty — hundreds of hand-overs
// each way. Meanwhile the receiver goes down (every stream of every
// subscription parks), and a delivering member is SIGKILLed every few
// seconds, once in the middle of the outage, so partitions move to the
// other member while their streams are parked (the park markers are read
// on assignment). Judged from outside: nothing lost, nothing reordered per
// (subscription, asset), duplicates only as repeated webhook-ids; then no
// park marker is left: every stream is back in the fast lane.
func TestFastLaneParkHandOverUnderKills(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.RealBrokers(t)
	db := pgtest.Empty(t)
	p := harness.NewPipeline(t, harness.PipelineConfig{
		DBURL: db.URL, Brokers: brokers, Partitions: 6,
		Procs:    map[string]int{"relay": 1, "deliver": 2},
		ExtraEnv: []string{"WEBHOOK_FAST_LANE=true"},
	})
	p.StartSampled()
	var delivers []*harness.Proc
	for _, pr := range p.Procs {
		if pr.Kind == "deliver" {
			delivers = append(delivers, pr)
		}
	}

	load := loadFor()
	ctx, cancel := context.WithTimeout(context.Background(), load)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	var killMu sync.Mutex
	kills := 0
	kill := func(why string) {
		killMu.Lock()
		defer killMu.Unlock()
		pr := delivers[kills%len(delivers)]
		kills++
		p.Kill(pr)
		t.Logf("%s: killed %s", why, pr.Name)
	}
	// Members SIGKILLed one at a time, alternately, every 4 s.
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(4 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				kill("periodic")
			}
		}
	}()
	at(ctx, start, load/4, &wg, func() {
		e := harness.Event{At: time.Now(), What: "receiver down"}
		p.Receiver.Down()
		// Half-way through the outage every stream that had work is parked:
		// the partitions then move to the survivor while parked.
		time.Sleep(2500 * time.Millisecond)
		kill("during the receiver outage")
		time.Sleep(2500 * time.Millisecond)
		if err := p.Receiver.Up(); err != nil {
			t.Errorf("receiver up: %v", err)
		}
		e.End = time.Now()
		p.Note(e)
	})
	p.Load(ctx, 30)
	loadEnd := time.Now()
	p.WatchDrain(t.Context(), loadEnd)
	wg.Wait()
	if _, err := p.WaitDrained(2 * time.Minute); err != nil {
		t.Errorf("drain: %v", err)
	}
	backInTheFastLane(t, p)
	var slow, slowFlaky int
	if err := p.Scan(context.Background(), `SELECT count(*), count(*) FILTER (WHERE s.url LIKE '%/flaky')
		FROM bridge.deliveries d JOIN bridge.subscriptions s ON s.id = d.subscription_id`, &slow, &slowFlaky); err != nil {
		t.Fatal(err)
	}
	if slowFlaky == 0 {
		t.Fatalf("no delivery of the flaky subscription went through the slow lane: the hand-over was not exercised")
	}
	finish(t, p, "fast lane: park hand-over, receiver outage, SIGKILL of delivering members", loadEnd, fastLaneCatchUp, 0, 0, false,
		map[string]any{"member kills": kills, "slow-lane rows": slow, "of them flaky": slowFlaky})
}

// The fast lane through a broker outage and a PostgreSQL outage, on a
// broker and a PostgreSQL instance of the test's own: two delivering
// members with WEBHOOK_FAST_LANE=true and two relays under load, the flaky
// subscription parking each of its streams at every event (hand-overs each
// way throughout). PostgreSQL is stopped with -m immediate and started
// again, and a member is SIGKILLed while it is down: its partitions move
// while no park marker can be read, so the survivor must not post a record
// of a stream it cannot yet tell is parked. Then the broker is SIGKILLed
// and restarted later, and a member is SIGKILLed while it is down: the
// group re-forms on the restarted broker, the relays produce the backlog
// the outage held back. Judged from outside as every scenario: nothing
// lost, nothing reordered per (subscription, asset), duplicates only as
// repeated webhook-ids with the same body (a copy the relay produced again
// after PostgreSQL lost its SENT mark is posted again, with the event's
// created-at as every copy: judge.Verdict.ReproducedBodies); and the
// pipeline catches up within
// fastLaneCatchUp of the broker serving again.
func TestFastLaneBrokerAndPostgresOutages(t *testing.T) {
	t.Parallel()
	pl := scenarioPlan()
	waitBroker := harness.StartBrokerAsync(t)
	defer waitBroker() //nolint:errcheck // a failed setup below still waits for it before the test ends
	pg := harness.StartPG(t, "fastlane", nil)
	if err := harness.CreateDB(pg.URL("postgres"), "bridge"); err != nil {
		t.Fatal(err)
	}
	broker, err := waitBroker()
	if err != nil {
		t.Fatal(err)
	}
	p := harness.NewPipeline(t, harness.PipelineConfig{
		DBURL: pg.URL("bridge"), Brokers: []string{broker.Addr()},
		Procs:    map[string]int{"relay": 2, "deliver": 2},
		ExtraEnv: []string{"WEBHOOK_FAST_LANE=true"},
	})
	p.StartSampled()
	var delivers []*harness.Proc
	for _, pr := range p.Procs {
		if pr.Kind == "deliver" {
			delivers = append(delivers, pr)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), pl.load)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	frac := func(f float64) time.Duration { return time.Duration(float64(pl.load) * f) }
	// The faults run one after the other, each to its end even when the
	// load has ended meanwhile (the broker's restart alone takes longer
	// than the load here), so the catch-up is measured from the last one.
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-ctx.Done():
			t.Error("the load ended before the first fault")
			return
		case <-time.After(time.Until(start.Add(frac(0.2)))):
		}
		e := harness.Event{At: time.Now(), What: "PostgreSQL down (stop -m immediate)"}
		if err := pg.Stop("immediate"); err != nil {
			t.Errorf("stop postgres: %v", err)
		}
		time.Sleep(pl.postgresDown / 2)
		p.Kill(delivers[0])
		time.Sleep(pl.postgresDown / 2)
		if err := pg.Start(); err != nil {
			t.Errorf("start postgres: %v\n%s", err, pg.Log())
		}
		e.End = time.Now()
		p.Note(e)

		time.Sleep(time.Until(start.Add(frac(0.5))))
		e = harness.Event{At: time.Now(), What: "broker down (SIGKILL)"}
		broker.Kill()
		time.Sleep(pl.brokerDown / 2)
		p.Kill(delivers[1])
		time.Sleep(pl.brokerDown / 2)
		if err := broker.Start(); err != nil {
			t.Errorf("broker restart: %v", err)
		}
		e.End = time.Now()
		p.Note(e)
	}()
	p.Load(ctx, pl.rate)
	loadEnd := time.Now()
	p.WatchDrain(t.Context(), loadEnd)
	wg.Wait()
	if _, err := p.WaitDrained(fastLaneCatchUp + 2*time.Minute); err != nil {
		t.Errorf("drain: %v", err)
	}
	backInTheFastLane(t, p)
	finish(t, p, "fast lane: broker and PostgreSQL outages, SIGKILL of a delivering member during each", loadEnd,
		fastLaneCatchUp, 0, 0, true, nil)
}

// fastLaneCatchUp bounds, in the fast-lane scenarios, the time from the
// end of the last fault (or of the load, if later) until every committed
// event has reached every subscription: the members rejoin, read the park
// markers, post the backlog, and the slow lane empties the parked streams.
const fastLaneCatchUp = 30 * time.Second

// backInTheFastLane waits until every stream is back in the fast lane: the
// slow lane emptied each parked stream and its last settle deleted the
// marker (a marker left with no rows by a rolled-back appender goes at the
// next sweep, once a minute), and no delivery row is open.
func backInTheFastLane(t *testing.T, p *harness.Pipeline) {
	t.Helper()
	testkit.Eventually(t, 90*time.Second, func() string {
		var parked, open int
		_ = p.Scan(context.Background(), `SELECT (SELECT count(*) FROM bridge.delivery_parks),
			(SELECT count(*) FROM bridge.deliveries WHERE status IN ('pending', 'delivering'))`, &parked, &open)
		return testkit.Unless(parked == 0 && open == 0, "%d streams still parked, %d open deliveries", parked, open)
	})
}
