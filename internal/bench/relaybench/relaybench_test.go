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
	if res.LatencyEvents != 400 || res.LatencyAchieved <= 0 || res.LatencyP99Ms <= 0 {
		t.Fatalf("latency run: %d events matched (want 400), achieved %.0f/s, p99 %.1f ms", res.LatencyEvents, res.LatencyAchieved, res.LatencyP99Ms)
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
