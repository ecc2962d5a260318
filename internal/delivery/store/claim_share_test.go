package store

import (
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"
)

// TestClaimLoopsShareSubscriptionsEvenly: the subscriptions a claim loop
// serves are the enabled ones by rank of id, the i-th to loop i mod loops,
// so 3 subscriptions over 4 loops get 3 different loops and 10 get 3/3/2/2
// (a disabled one takes no rank). With a hash of the id two or three of 3
// often shared one serial loop while the other loops claimed for nothing.
// Every loop claims once with one delivery pending per subscription: what
// each returns is the set it serves, and together they serve each
// subscription exactly once.
func TestClaimLoopsShareSubscriptionsEvenly(t *testing.T) {
	for _, tc := range []struct {
		subs int
		want []int // subscriptions per loop, sorted
	}{
		{3, []int{0, 1, 1, 1}},
		{10, []int{2, 2, 3, 3}},
	} {
		t.Run(fmt.Sprint(tc.subs), func(t *testing.T) {
			b, ctx := setup(t)
			var ids []string
			for i := range tc.subs {
				s := b.createSub(t, fmt.Sprintf("https://s%d.example/hook", i))
				b.insert(t, s.ID, "x", 1, `{}`)
				ids = append(ids, s.ID)
			}
			// A disabled subscription with work of its own: not served, and
			// not counted in the ranks.
			off := b.createSub(t, "https://off.example/hook")
			b.insert(t, off.ID, "x", 1, `{}`)
			if _, err := b.subs.Disable(ctx, off.ID, "test"); err != nil {
				t.Fatal(err)
			}
			slices.Sort(ids)
			served := map[string]int{}
			var per []int
			for loop := range 4 {
				res, err := b.store.ClaimShare(ctx, ClaimParams{ClaimedBy: "w", Limit: 100, MaxInFlight: 8,
					Lease: time.Minute, Loops: 4, Loop: loop})
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Claims) != res.Subscriptions {
					t.Fatalf("loop %d claimed %d rows for %d subscriptions; want one each", loop, len(res.Claims), res.Subscriptions)
				}
				for _, c := range res.Claims {
					served[c.SubscriptionID]++
					// Deterministic: the same rank, the same loop, in every replica.
					if rank := slices.Index(ids, c.SubscriptionID); rank%4 != loop {
						t.Errorf("subscription of rank %d served by loop %d, want %d", rank, loop, rank%4)
					}
				}
				per = append(per, res.Subscriptions)
			}
			sort.Ints(per)
			if !slices.Equal(per, tc.want) {
				t.Errorf("subscriptions per loop %v, want %v", per, tc.want)
			}
			for _, id := range ids {
				if served[id] != 1 {
					t.Errorf("subscription %s served by %d loops, want 1", id, served[id])
				}
			}
			if served[off.ID] != 0 {
				t.Errorf("disabled subscription served")
			}
		})
	}
}
