package delivery

import (
	"testing"
	"time"
)

// The lingers follow the load: a loop whose statements are cheap (a machine
// with CPU to spare) waits no longer than they take, one whose statements
// are dear (a saturated machine) waits the whole linger, and an idle one
// not at all.
func TestLingerFollowsWhatClaimsCost(t *testing.T) {
	ms := time.Millisecond
	cheap, dear := pace{}, pace{}
	for range 20 {
		cheap.observe(ms)
		dear.observe(40 * ms)
	}
	const capacity, minClaim = 128, 32
	cases := []struct {
		name string
		out  int
		lean bool
		cost pace
		want time.Duration
	}{
		{"idle: nothing out", 0, true, dear, 0},
		{"no slot free: the loop waits for a poke", capacity, true, dear, 0},
		{"many free, last claim not lean", 10, false, dear, 0},
		{"lean, claims cheap", 10, true, cheap, paceShare * ms},
		{"lean, claims dear", 10, true, dear, claimLinger},
		{"few free, claims cheap", capacity - 4, false, cheap, ms * min(paceShare, 5)},
		{"few free, claims dear", capacity - 4, false, dear, fewFreeLinger},
		{"lean, nothing measured yet", 10, true, pace{}, 0},
	}
	for _, c := range cases {
		if got := claimGap(c.out, capacity, minClaim, c.lean, c.cost); got != c.want {
			t.Errorf("%s: gap %v, want %v", c.name, got, c.want)
		}
	}
}

// The average moves toward what the statement costs now, so a loop whose
// machine becomes saturated lingers longer within a few claims, and one
// whose load went away stops lingering as soon.
func TestPaceFollowsTheLoad(t *testing.T) {
	ms := time.Millisecond
	var p pace
	for range 10 {
		p.observe(2 * ms)
	}
	if g := p.gap(claimLinger); g != paceShare*2*ms {
		t.Fatalf("steady 2 ms claims: gap %v", g)
	}
	for range 10 {
		p.observe(50 * ms)
	}
	if g := p.gap(claimLinger); g != claimLinger {
		t.Fatalf("after 10 claims of 50 ms: gap %v, want the whole %v", g, claimLinger)
	}
	for range 15 {
		p.observe(2 * ms)
	}
	if g := p.gap(claimLinger); g > paceShare*3*ms {
		t.Fatalf("15 cheap claims after the load: gap %v, want back near %v", g, paceShare*2*ms)
	}
}
