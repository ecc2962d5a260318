package relaybench

import (
	"context"
	"errors"
	"testing"
	"time"

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
