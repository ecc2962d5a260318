package harness

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Group watches the pipeline's consumer group from outside, through the
// broker's own view: its committed offsets and its members' assignments.
type Group struct {
	Name, Topic string
	cl          *kgo.Client
	adm         *kadm.Client
}

// Group opens an admin client on the pipeline's consumer group.
func (p *Pipeline) Group() (*Group, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.Brokers...), kgo.RequestTimeoutOverhead(time.Second), kgo.RetryTimeout(time.Second))
	if err != nil {
		return nil, err
	}
	return &Group{Name: "chaos-" + p.Topic, Topic: p.Topic, cl: cl, adm: kadm.NewClient(cl)}, nil
}

// Close closes its client.
func (g *Group) Close() { g.cl.Close() }

// Commits returns the group's committed offset per partition of the topic.
func (g *Group) Commits(ctx context.Context) (map[int32]int64, error) {
	resp, err := g.adm.FetchOffsets(ctx, g.Name)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for part, o := range resp[g.Topic] {
		out[part] = o.At
	}
	return out, nil
}

// Members returns, for a stable group, each member id and how
// many partitions of the topic it was assigned; an error while the group is
// rebalancing.
func (g *Group) Members(ctx context.Context) (map[string]int, error) {
	dg, err := g.adm.DescribeGroups(ctx, g.Name)
	if err != nil {
		return nil, err
	}
	d, ok := dg[g.Name]
	if !ok || d.Err != nil {
		return nil, fmt.Errorf("describe group %s: %v", g.Name, d.Err)
	}
	if d.State != "Stable" {
		return nil, fmt.Errorf("group %s is %s", g.Name, d.State)
	}
	out := map[string]int{}
	for _, m := range d.Members {
		n := 0
		if c, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range c.Topics {
				if t.Topic == g.Topic {
					n += len(t.Partitions)
				}
			}
		}
		out[m.MemberID] = n
	}
	return out, nil
}

// AllAdvanced waits until every partition in base has a committed offset
// beyond base's and returns when that was first seen, polling every
// interval; each partition's own moment is in the second result.
func (g *Group) AllAdvanced(ctx context.Context, base map[int32]int64, interval time.Duration) (time.Time, map[int32]time.Time, error) {
	seen := map[int32]time.Time{}
	for {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := g.Commits(qctx)
		cancel()
		now := time.Now()
		if err == nil {
			for part, off := range base {
				if _, ok := seen[part]; !ok && c[part] > off {
					seen[part] = now
				}
			}
			if len(seen) == len(base) {
				return now, seen, nil
			}
		}
		select {
		case <-ctx.Done():
			return time.Time{}, seen, fmt.Errorf("%d of %d partitions advanced: %w", len(seen), len(base), ctx.Err())
		case <-time.After(interval):
		}
	}
}
