package deliverbench

import (
	"slices"
	"testing"
	"time"
)

// The meter gives each member its deliveries, when its last one arrived and
// its longest run without any, from the partitions it owns: member 0 (
// partitions 0 and 2) delivers at 0.05 s, 0.15 s and, after half a second
// without a delivery, 0.75 s; member 1 (partition 1) once at 0.35 s.
func TestPartitionMeterMembers(t *testing.T) {
	start := time.Now()
	asset := func(s string) *string { return &s }
	// asset-0 and asset-3 are on partition 0, asset-1 on 1, asset-2 on 2.
	m := newPartitionMeter([]int32{0, 1, 2, 0}, 3, start, 2*time.Second)
	at := func(d time.Duration) time.Time { return start.Add(d) }
	m.observe(asset("asset-0"), at(50*time.Millisecond))
	m.observe(asset("asset-2"), at(150*time.Millisecond))
	m.observe(asset("asset-1"), at(350*time.Millisecond))
	m.observe(asset("asset-3"), at(750*time.Millisecond))
	m.observe(asset("not-a-bench-asset"), at(750*time.Millisecond))
	m.observe(nil, at(750*time.Millisecond))

	var res Result
	m.fill([][]int32{{0, 2}, {1}}, &res)
	if !slices.Equal(res.PartitionDeliveries, []int64{2, 1, 1}) {
		t.Fatalf("partition deliveries %v, want [2 1 1]", res.PartitionDeliveries)
	}
	if !slices.Equal(res.MemberPartitions, []int{2, 1}) || !slices.Equal(res.MemberDeliveries, []int64{3, 1}) {
		t.Fatalf("member partitions %v deliveries %v, want [2 1] and [3 1]", res.MemberPartitions, res.MemberDeliveries)
	}
	if !slices.Equal(res.MemberDoneSeconds, []float64{0.8, 0.4}) {
		t.Fatalf("members done at %v s, want [0.8 0.4]", res.MemberDoneSeconds)
	}
	if !slices.Equal(res.MemberLongestGapSeconds, []float64{0.5, 0}) {
		t.Fatalf("members' longest gaps %v s, want [0.5 0]", res.MemberLongestGapSeconds)
	}
	if len(res.MemberTimeline) != 2 || !slices.Equal(res.MemberTimeline[0], []int64{2, 1}) ||
		!slices.Equal(res.MemberTimeline[1], []int64{1}) {
		t.Fatalf("members' half-second timelines %v, want [[2 1] [1]]", res.MemberTimeline)
	}
}

func TestSameAssignment(t *testing.T) {
	a := [][]int32{{0, 1}, {2, 3}}
	if !sameAssignment(a, [][]int32{{0, 1}, {2, 3}}) {
		t.Fatal("the same assignment differs")
	}
	for _, b := range [][][]int32{{{0, 1}, {2}}, {{0, 1, 2, 3}}, {{0, 1}, {2, 3}, {}}, nil} {
		if sameAssignment(a, b) {
			t.Fatalf("%v and %v compare equal", a, b)
		}
	}
}
