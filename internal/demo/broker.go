package demo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxbridge/bridge/internal/kafkaclient"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// partitions of the demo's topic: more than one, so the run shows that the
// order promised is per asset (one partition per key), not global.
const partitions = 3

// TopicPrefix starts every demo topic; a run's topic is TopicPrefix + run id.
const TopicPrefix = "demo.assets."

// Topic is the topic of run runID. Each run has its own, so a second run on
// the same database (and the same broker) never sees the first one's records.
func Topic(runID string) string { return TopicPrefix + runID }

// StartBroker starts the embedded Kafka broker: an in-process kfake cluster
// of one broker on a loopback port (ListenAddrs), with topic already created.
// It speaks the Kafka protocol over TCP, so kcat and any other client can read
// it while the demo runs.
func StartBroker(topic string) (*kfake.Cluster, error) {
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, topic),
		kfake.DefaultNumPartitions(partitions),
		// The consumer dead-letters unreadable records to "<topic>.dlq";
		// the demo produces none, but a bug would, and it should land.
		kfake.AllowAutoTopicCreation(),
	)
	if err != nil {
		return nil, fmt.Errorf("start embedded Kafka broker: %w", err)
	}
	return c, nil
}

// CreateTopic creates topic on the cluster opts connect to (a real broker in
// KAFKA_BROKERS) and waits until every partition has a leader, so the first
// produce and the consumer's first metadata request do not race its creation.
func CreateTopic(ctx context.Context, opts []kgo.Opt, topic string) error {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Replication factor -1: the broker's default.
	resp, err := adm.CreateTopic(ctx, partitions, -1, nil, topic)
	if err == nil && !errors.Is(resp.Err, kerr.TopicAlreadyExists) {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	if kafkaclient.WaitTopicReady(ctx, adm, topic, partitions, 0) != nil {
		return fmt.Errorf("topic %s has no leader for every partition after 30s", topic)
	}
	return nil
}

// RemoveTopic deletes a run's topic, its dead-letter topic and its consumer
// group from a real broker, so demo runs leave nothing behind there.
func RemoveTopic(ctx context.Context, opts []kgo.Opt, topic, group string) error {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var errs []error
	groups, err := adm.DeleteGroups(ctx, group)
	if err != nil {
		errs = append(errs, fmt.Errorf("delete consumer group %s: %w", group, err))
	}
	for _, r := range groups {
		if r.Err != nil && !errors.Is(r.Err, kerr.GroupIDNotFound) {
			errs = append(errs, fmt.Errorf("delete consumer group %s: %w", r.Group, r.Err))
		}
	}
	resp, err := adm.DeleteTopics(ctx, topic, topic+".dlq")
	if err != nil {
		errs = append(errs, fmt.Errorf("delete topic %s: %w", topic, err))
	}
	for _, r := range resp {
		if r.Err != nil && !errors.Is(r.Err, kerr.UnknownTopicOrPartition) {
			errs = append(errs, fmt.Errorf("delete topic %s: %w", r.Topic, r.Err))
		}
	}
	return errors.Join(errs...)
}
