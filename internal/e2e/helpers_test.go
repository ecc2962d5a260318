package e2e_test

import (
	"testing"

	"github.com/outboxbridge/bridge/internal/e2e"
	"github.com/outboxbridge/bridge/internal/kafkatest"
)

// realPipeline is an e2e test's opening: the test runs in parallel (its
// database and topics are its own) on a pipeline over the real broker whose
// topic has the given partitions; withOperations adds a one-partition
// operations topic (BRIDGE_OPERATIONS_TOPIC).
func realPipeline(t *testing.T, partitions int32, withOperations bool, cfg e2e.Config) *e2e.Pipeline {
	t.Helper()
	t.Parallel()
	cfg.Brokers = kafkatest.RealBrokers(t)
	cfg.Topic = kafkatest.CreateTopic(t, cfg.Brokers, partitions, nil)
	if withOperations {
		cfg.OperationsTopic = kafkatest.CreateTopic(t, cfg.Brokers, 1, nil)
	}
	return e2e.New(t, cfg)
}
