package deliverbench_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/cli"
	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/delivery/deliverbench"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

// memberEnv marks a run of this test binary as a `bridge deliver` member
// (see TestMain).
const memberEnv = "DELIVERBENCH_TEST_MEMBER"

// TestMain runs `bridge deliver` instead of the tests when started as a
// member process by TestRunFastLaneMemberProcesses.
func TestMain(m *testing.M) {
	if os.Getenv(memberEnv) == "1" {
		os.Exit(cli.Execute([]string{"deliver"}, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// Two members as `bridge deliver` processes of their own: the group forms
// across the processes before the backlog is committed, the drain has no
// order violation, overlap or duplicate, every attempt is logged, and the
// members' CPU is measured apart from the bench's.
func TestRunFastLaneMemberProcesses(t *testing.T) {
	db := pgtest.NewParallel(t)
	brokers := kafkatest.RealBrokers(t)
	res, err := deliverbench.Run(context.Background(), db.Pool, deliverbench.Options{
		Subscriptions: 3, Assets: 20, Events: 600, Replicas: 2,
		Deliverer: delivery.Config{Workers: 16, PollInterval: 50 * time.Millisecond},
		Timeout:   2 * time.Minute,
		Kafka: &deliverbench.FastLaneOptions{KafkaOpts: []kgo.Opt{kgo.SeedBrokers(brokers...)}, Partitions: 6,
			DatabaseURL: db.URL,
			Member: func(env []string) *exec.Cmd {
				c := exec.Command(os.Args[0])
				c.Env = append(os.Environ(), env...)
				c.Env = append(c.Env, memberEnv+"=1", "KAFKA_BROKERS="+strings.Join(brokers, ","))
				c.Stdout, c.Stderr = t.Output(), t.Output()
				return c
			}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.OrderViolations != 0 || res.NotDelivered != 0 || res.Overlaps != 0 || res.Duplicates != 0 || res.SignatureFailures != 0 {
		t.Fatalf("violations=%d not delivered=%d overlaps=%d duplicates=%d signature failures=%d",
			res.OrderViolations, res.NotDelivered, res.Overlaps, res.Duplicates, res.SignatureFailures)
	}
	if !res.MemberProcesses || res.Replicas != 2 || res.GroupFormSeconds <= 0 || res.DeliveriesPerSecond <= 0 {
		t.Fatalf("member processes %v, replicas %d, group formed in %.3fs, %.0f/s", res.MemberProcesses, res.Replicas,
			res.GroupFormSeconds, res.DeliveriesPerSecond)
	}
	if res.PostgresInsertsPerDelivery < 1 || res.PostgresInsertsPerDelivery > 1.1 {
		t.Fatalf("inserts per delivery %.3f: every attempt is logged once", res.PostgresInsertsPerDelivery)
	}
	if res.MembersCPUMicrosPerDelivery <= 0 {
		t.Fatalf("members' CPU per delivery %.1f µs: not measured", res.MembersCPUMicrosPerDelivery)
	}
	// Each member process's share, from the receiver's counts per
	// partition and the group's assignment: 6 partitions, 3 each, every
	// delivery of the backlog counted once, and no reassignment (the group
	// formed before the drain).
	var parts, members, perPartition int64
	for _, n := range res.MemberPartitions {
		parts += int64(n)
	}
	for _, n := range res.MemberDeliveries {
		members += n
	}
	for _, n := range res.PartitionDeliveries {
		perPartition += n
	}
	if !slices.Equal(res.MemberPartitions, []int{3, 3}) || parts != 6 || len(res.PartitionDeliveries) != 6 ||
		members != int64(res.Events) || perPartition != int64(res.Events) || len(res.MemberDoneSeconds) != 2 {
		t.Fatalf("member partitions %v, member deliveries %v (sum %d), partition deliveries %v (sum %d), done %v; backlog %d",
			res.MemberPartitions, res.MemberDeliveries, members, res.PartitionDeliveries, perPartition, res.MemberDoneSeconds, res.Events)
	}
	if res.GroupReassignedDuringDrain {
		t.Fatal("the group's assignment changed during the drain")
	}
}
