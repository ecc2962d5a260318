package relaybench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/relay"
)

func benchConfig() relay.Config {
	return relay.Config{BatchSize: 500, PollInterval: 100 * time.Millisecond, LeaseTimeout: 2 * time.Second, ProduceTimeout: 5 * time.Second}
}

// A small run measures everything it reports: the drain counted from acks,
// both PostgreSQL ceilings on the drain's backlog size, latency with the
// achieved rate, and exactly the drained records read back, in order.
func TestRunMeasuresAndVerifies(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.RealBrokers(t)
	db := pgtest.New(t)
	res, err := Run(context.Background(), db.Pool, []kgo.Opt{kgo.SeedBrokers(brokers...)}, benchConfig(), Options{
		Events: 3000, Assets: 50, Partitions: 3, Rate: 200, RateDuration: 2 * time.Second, Writers: 2, TxEvents: 2,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Verified != 3000 || res.OrderViolations != 0 {
		t.Fatalf("verified %d records (want exactly the 3000 drained), %d keys out of order", res.Verified, res.OrderViolations)
	}
	if res.DrainRate <= 0 || res.CeilingClaimMark <= 0 || res.CeilingRelayStatements <= 0 || res.CeilingProduce <= 0 || res.ClaimP99Ms <= 0 {
		t.Fatalf("missing measurements: %+v", res)
	}
	// The drain writes no event row: no UPDATE, no DELETE, no dead tuple
	// (only the lanes' positions move).
	if res.OutboxUpdatesPerEvent != 0 || res.OutboxDeletesPerEvent != 0 || res.OutboxDeadTuples != 0 {
		t.Fatalf("outbox writes per event: %.2f updates, %.2f deletes, %d dead tuples", res.OutboxUpdatesPerEvent, res.OutboxDeletesPerEvent, res.OutboxDeadTuples)
	}
	if res.LatencyEvents != 400 || res.LatencyAchieved <= 0 || res.LatencyP99Ms <= 0 {
		t.Fatalf("latency run: %d events matched (want 400), achieved %.0f/s, p99 %.1f ms", res.LatencyEvents, res.LatencyAchieved, res.LatencyP99Ms)
	}
	d := res.LatencyDetail
	if d.Events != 400 || d.ClaimMs <= 0 || d.BrokerMs <= 0 || res.ProduceRequests == 0 || res.ProduceRequestP99Ms <= 0 {
		t.Fatalf("latency by relay state: %+v; %d produce requests, p99 %.1f ms", d, res.ProduceRequests, res.ProduceRequestP99Ms)
	}
	if sum := d.WakeMs + d.BusyClaimMs + d.BusyProduceMs + d.BusyMarksMs + d.ClaimMs + d.BuildMs + d.BrokerMs; sum > res.LatencyMaxMs {
		t.Fatalf("the parts of the mean commit→ack add up to %.1f ms, above the slowest event's %.1f ms: %+v", sum, res.LatencyMaxMs, d)
	}
}

// The split by relay state charges each part of an event's wait to what the
// relay was doing then: idle (waiting for the NOTIFY), another cycle's
// claim, produce or wait for marks, then its own claim, build and ack.
func TestDetailChargesWhatTheRelayWasDoing(t *testing.T) {
	t0 := time.Now()
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	l := newLatencies()
	l.setActive(true)
	// Cycle 1: idle from 0, claims 1–3, produced at 3.5, acked at 7, its
	// previous marks settled at 8. Cycle 2 follows at once (no idle): claims
	// 8–10, produced at 10.5, acked at 12.
	l.cycled(relay.CycleTimes{IdleFrom: at(0), ClaimStart: at(1), ClaimEnd: at(3), Produced: at(3.5), Acked: at(7), Settled: at(8), Rows: 1})
	l.cycled(relay.CycleTimes{ClaimStart: at(8), ClaimEnd: at(10), Produced: at(10.5), Acked: at(12), Settled: at(12), Rows: 1})
	// Event a commits at 0.5 (idle) and is acked at 7 by cycle 1; event b
	// commits at 5 (cycle 1 producing) and is acked at 12 by cycle 2.
	l.commit([]string{"a"}, at(0.5))
	l.acked("a", at(7))
	l.commit([]string{"b"}, at(5))
	l.acked("b", at(12))
	all, _ := l.detail()
	const eps = 0.01
	want := Detail{Events: 2, WakeMs: 0.5 / 2, BusyProduceMs: 2.0 / 2, BusyMarksMs: 1.0 / 2, ClaimMs: (2 + 2) / 2.0, BuildMs: (0.5 + 0.5) / 2, BrokerMs: (3.5 + 1.5) / 2}
	got := all
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"wake", got.WakeMs, want.WakeMs}, {"busy claim", got.BusyClaimMs, 0}, {"busy produce", got.BusyProduceMs, want.BusyProduceMs},
		{"busy marks", got.BusyMarksMs, want.BusyMarksMs}, {"claim", got.ClaimMs, want.ClaimMs}, {"build", got.BuildMs, want.BuildMs}, {"broker", got.BrokerMs, want.BrokerMs}} {
		if c.got < c.want-eps || c.got > c.want+eps {
			t.Errorf("%s: %.3f ms, want %.3f (all: %+v)", c.name, c.got, c.want, got)
		}
	}
	if got.Events != 2 {
		t.Errorf("%d events matched, want 2", got.Events)
	}
}

// With RelaysFirst, replicas spread the lanes before the backlog is
// written, and the drain still reads back exactly the drained records in
// order.
func TestRunRelaysFirstWithReplicas(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.RealBrokers(t)
	db := pgtest.New(t)
	res, err := Run(context.Background(), db.Pool, []kgo.Opt{kgo.SeedBrokers(brokers...)}, benchConfig(), Options{
		Events: 1000, Assets: 50, Partitions: 3, Rate: 50, RateDuration: time.Second, Writers: 1, TxEvents: 1, Replicas: 2, RelaysFirst: true,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Verified != 1000 || res.OrderViolations != 0 || !res.RelaysFirst || res.Replicas != 2 || res.DrainRate <= 0 || res.FillSeconds <= 0 {
		t.Fatalf("relays-first run: %+v", res)
	}
}

// A short sustained run with a transaction held open reports per-minute
// figures. (The bench refuses a run whose writers fall short of the offered
// rate; the rate here is low so that a busy CI machine's -race build reaches
// it: at 200/s one loaded run committed only 141/s.)
func TestSustainReportsTheRun(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.RealBrokers(t)
	db := pgtest.New(t)
	res, err := Sustain(context.Background(), db.Pool, []kgo.Opt{kgo.SeedBrokers(brokers...)}, benchConfig(), SustainOptions{
		Duration: 3 * time.Second, Rate: 60, Writers: 2, TxEvents: 5, Assets: 20, Partitions: 3, HoldXmin: true,
	}, nil)
	// Should the writers still fall short, that is reported as an error
	// with the result, which is still complete.
	if err != nil && !(errors.Is(err, ErrShortOfRate) && res != nil) {
		t.Fatal(err)
	}
	if res.Events != 180 || len(res.Minutes) != 1 || res.Minutes[0].Acked != 180 || res.ClaimP99FirstMinuteMs <= 0 || !res.HoldXmin {
		t.Fatalf("sustained run: %+v", res)
	}
	// The log is only appended to, held snapshot or not.
	if res.OutboxUpdatesPerEvent != 0 || res.OutboxDeletesPerEvent != 0 || res.DeadTuplesAtEnd != 0 || res.OutboxVacuums != 0 {
		t.Fatalf("outbox writes during the sustained run: %.2f updates and %.2f deletes per event, %d dead tuples, %d vacuums",
			res.OutboxUpdatesPerEvent, res.OutboxDeletesPerEvent, res.DeadTuplesAtEnd, res.OutboxVacuums)
	}
}

// A run deletes the topics it made, and they stay deleted: the bench's
// producers allow auto-creation (the relay's options), so one that still
// knew a topic when it was deleted re-created it at its next metadata
// refresh — one produce-ceiling topic per run piled up on the broker. The
// refresh is made frequent here so that a producer left open would do it
// within the run.
func TestRunLeavesNoTopicsBehind(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.RealBrokers(t)
	db := pgtest.New(t)
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.MetadataMinAge(50 * time.Millisecond), kgo.MetadataMaxAge(100 * time.Millisecond)}
	res, err := Run(context.Background(), db.Pool, opts, benchConfig(), Options{
		Events: 500, Assets: 10, Partitions: 1, Rate: 50, RateDuration: time.Second, Writers: 1, TxEvents: 1,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Topics) != 2 {
		t.Fatalf("run made topics %q, want the drain's and the produce ceiling's", res.Topics)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		md, err := adm.ListTopics(ctx, res.Topics...)
		if err != nil {
			t.Fatalf("list topics: %v", err)
		}
		var left []string
		for _, d := range md {
			if d.Err == nil {
				left = append(left, d.Topic)
			}
		}
		if len(left) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topics %q still on the broker after the run", left)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
