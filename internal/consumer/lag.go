package consumer

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
)

// PartitionLag is how far the group is behind on one partition.
type PartitionLag struct {
	Topic     string
	Partition int32
	// Committed is the group's committed offset (-1: none yet).
	Committed int64
	// End is the partition's end offset (high watermark, or last stable
	// offset under read_committed).
	End int64
	// Lag is End minus Committed (from the log start when nothing is
	// committed yet); -1 when either offset could not be read.
	Lag int64
}

// Lag reports the consumer group's lag per partition it has committed to or
// is assigned, sorted by topic and partition. It asks the brokers (one
// DescribeGroups, OffsetFetch and ListOffsets round), so call it at scrape
// time, not per record. It needs the client open: while Run is running.
func (c *Consumer) Lag(ctx context.Context) ([]PartitionLag, error) {
	return GroupLag(ctx, kadm.NewClient(c.client), c.cfg.Group)
}

// GroupLag is Lag for any group, through any admin client: a process that
// does not consume (the console of `bridge deliver`) can still show the
// consumers' lag.
func GroupLag(ctx context.Context, adm *kadm.Client, group string) ([]PartitionLag, error) {
	lags, err := adm.Lag(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("consumer group lag: %w", err)
	}
	gl, ok := lags[group]
	if !ok {
		return nil, nil
	}
	if err := gl.Error(); err != nil {
		return nil, fmt.Errorf("consumer group lag: %w", err)
	}
	var out []PartitionLag
	for topic, ps := range gl.Lag {
		for p, l := range ps {
			out = append(out, PartitionLag{Topic: topic, Partition: p, Committed: l.Commit.At, End: l.End.Offset, Lag: l.Lag})
		}
	}
	slices.SortFunc(out, func(a, b PartitionLag) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out, nil
}
