package kafkaclient

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// WaitTopicReady polls topic's metadata until it has partitions partitions,
// each with a leader and at least minISR in-sync replicas, and returns nil;
// or returns ctx's error when ctx ends first. A produce, or a consumer's
// first metadata request, right after CreateTopic can otherwise race the
// topic's creation (and, under a broker restart, its replication).
func WaitTopicReady(ctx context.Context, adm *kadm.Client, topic string, partitions, minISR int) error {
	for {
		if topicReady(ctx, adm, topic, partitions, minISR) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func topicReady(ctx context.Context, adm *kadm.Client, topic string, partitions, minISR int) bool {
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		return false
	}
	td, ok := md.Topics[topic]
	if !ok || td.Err != nil || len(td.Partitions) != partitions {
		return false
	}
	for _, p := range td.Partitions {
		if p.Leader < 0 || p.Err != nil || len(p.ISR) < minISR {
			return false
		}
	}
	return true
}
