package deliverbench

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// meterBucket is the width of a partitionMeter's time buckets.
const meterBucket = 100 * time.Millisecond

// partitionMeter counts the backlog's deliveries per partition of the bench
// topic (the fast lane), in meterBucket buckets from the backlog's commit:
// with the partitions each member owned, it gives every member's deliveries,
// when its last one arrived and how long it went without any, whether the
// members run in separate processes or not.
type partitionMeter struct {
	start time.Time
	// assetPart: the partition of asset-<i> (the record key), from the
	// producer's acknowledgements.
	assetPart []int32
	count     []atomic.Int64
	buckets   [][]atomic.Int64 // [partition][bucket]
}

func newPartitionMeter(assetPart []int32, parts int, start time.Time, span time.Duration) *partitionMeter {
	m := &partitionMeter{start: start, assetPart: assetPart, count: make([]atomic.Int64, parts),
		buckets: make([][]atomic.Int64, parts)}
	n := int(span/meterBucket) + 1
	for p := range m.buckets {
		m.buckets[p] = make([]atomic.Int64, n)
	}
	return m
}

// observe counts a backlog delivery of asset received at t.
func (m *partitionMeter) observe(asset *string, t time.Time) {
	if asset == nil {
		return
	}
	i, err := strconv.Atoi(strings.TrimPrefix(*asset, "asset-"))
	if err != nil || i < 0 || i >= len(m.assetPart) {
		return
	}
	p := m.assetPart[i]
	if p < 0 || int(p) >= len(m.count) {
		return
	}
	m.count[p].Add(1)
	b := int(t.Sub(m.start) / meterBucket)
	b = min(max(b, 0), len(m.buckets[p])-1)
	m.buckets[p][b].Add(1)
}

// memberFigures is what the meter shows of one member owning parts.
type memberFigures struct {
	delivered int64
	// done: the end of the bucket of its last delivery, from the start;
	// gap: its longest run of buckets without a delivery between its first
	// and its last.
	done, gap time.Duration
	// timeline: its deliveries in each timelineStep from the start, up to
	// its last.
	timeline []int64
}

// timelineStep is the width of memberFigures.timeline's steps.
const timelineStep = 500 * time.Millisecond

func (m *partitionMeter) member(parts []int32) memberFigures {
	var f memberFigures
	first, last, run := -1, -1, 0
	for b := range m.buckets[0] {
		var n int64
		for _, p := range parts {
			if int(p) < len(m.buckets) {
				n += m.buckets[p][b].Load()
			}
		}
		if n == 0 {
			run++
			continue
		}
		f.delivered += n
		step := b * int(meterBucket) / int(timelineStep)
		for len(f.timeline) <= step {
			f.timeline = append(f.timeline, 0)
		}
		f.timeline[step] += n
		if first >= 0 {
			f.gap = max(f.gap, time.Duration(run)*meterBucket)
		}
		if first < 0 {
			first = b
		}
		last, run = b, 0
	}
	if last >= 0 {
		f.done = time.Duration(last+1) * meterBucket
	}
	return f
}

// partitions returns each partition's deliveries.
func (m *partitionMeter) partitions() []int64 {
	out := make([]int64, len(m.count))
	for p := range m.count {
		out[p] = m.count[p].Load()
	}
	return out
}

// fill puts the members' figures in res; owned is each member's partitions.
func (m *partitionMeter) fill(owned [][]int32, res *Result) {
	res.PartitionDeliveries = m.partitions()
	res.MemberPartitions, res.MemberDeliveries, res.MemberDoneSeconds, res.MemberLongestGapSeconds = nil, nil, nil, nil
	res.MemberTimeline = nil
	for _, parts := range owned {
		f := m.member(parts)
		res.MemberPartitions = append(res.MemberPartitions, len(parts))
		res.MemberDeliveries = append(res.MemberDeliveries, f.delivered)
		res.MemberDoneSeconds = append(res.MemberDoneSeconds, f.done.Seconds())
		res.MemberLongestGapSeconds = append(res.MemberLongestGapSeconds, f.gap.Seconds())
		res.MemberTimeline = append(res.MemberTimeline, f.timeline)
	}
}

// groupAssignment is each member's partitions of topic in group, as the
// group's coordinator has them (members in member-id order, partitions
// sorted); nil when the group cannot be described.
func groupAssignment(ctx context.Context, adm *kadm.Client, group, topic string) [][]int32 {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	gs, err := adm.DescribeGroups(dctx, group)
	if err != nil {
		return nil
	}
	g, ok := gs[group]
	if !ok || g.Err != nil {
		return nil
	}
	ids := make([]string, 0, len(g.Members))
	for _, mem := range g.Members {
		ids = append(ids, mem.MemberID)
	}
	slices.Sort(ids)
	var out [][]int32
	for _, id := range ids {
		var parts []int32
		for _, mem := range g.Members {
			if mem.MemberID != id {
				continue
			}
			if c, ok := mem.Assigned.AsConsumer(); ok {
				for _, t := range c.Topics {
					if t.Topic == topic {
						parts = append(parts, t.Partitions...)
					}
				}
			}
		}
		slices.Sort(parts)
		out = append(out, parts)
	}
	return out
}

// sameAssignment reports whether a and b give the same members the same
// partitions.
func sameAssignment(a, b [][]int32) bool {
	return slices.EqualFunc(a, b, func(x, y []int32) bool { return slices.Equal(x, y) })
}
