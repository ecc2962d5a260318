package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPruneIdleStreamsNeverStrandsADelivery: idle streams are deleted in
// bounded batches while new deliveries arrive for those same streams, and
// afterwards every open delivery still has a stream the claim will look at,
// and every one is claimed.
func TestPruneIdleStreamsNeverStrandsADelivery(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSub(t, "https://example.com/hook")
	const streams = 200
	for i := range streams {
		b.insert(t, sub.ID, fmt.Sprintf("a%d", i), 1, `{}`)
	}
	drain := func() int {
		total := 0
		for {
			cs, err := b.store.Claim(ctx, ClaimParams{ClaimedBy: "w", Limit: 500, MaxInFlight: 1000, Lease: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if len(cs) == 0 {
				return total
			}
			for i := range cs {
				if _, err := b.store.Complete(ctx, &cs[i], "w", Outcome{StartedAt: time.Now(), StatusCode: 200}); err != nil {
					t.Fatal(err)
				}
			}
			total += len(cs)
		}
	}
	if n := drain(); n != streams {
		t.Fatalf("delivered %d, want %d", n, streams)
	}
	// Each stream's last success parked it: nothing left in them.
	idle := func() int {
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM bridge.delivery_streams WHERE ready_at = 'infinity'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := idle(); n != streams {
		t.Fatalf("%d idle streams, want %d", n, streams)
	}
	// Bounded: one batch deletes at most its limit.
	if n, err := b.store.PruneIdleStreams(ctx, 50); err != nil || n != 50 {
		t.Fatalf("PruneIdleStreams(50) = %d, %v; want 50", n, err)
	}

	// New deliveries for every stream, in shuffled order and separate
	// transactions, while pruning runs in small batches.
	var wg sync.WaitGroup
	var inserting atomic.Bool
	var pruned atomic.Int64
	inserting.Store(true)
	wg.Go(func() {
		defer inserting.Store(false)
		for round := 2; round <= 3; round++ {
			for _, i := range rand.Perm(streams) {
				b.insert(t, sub.ID, fmt.Sprintf("a%d", i), round, `{}`)
			}
		}
	})
	wg.Go(func() {
		for inserting.Load() {
			n, err := b.store.PruneIdleStreams(ctx, 7)
			if err != nil {
				t.Error(err)
				return
			}
			pruned.Add(int64(n))
		}
	})
	wg.Wait()
	t.Logf("pruned %d idle streams while inserting", pruned.Load())

	var stranded int
	if err := b.pool.QueryRow(ctx, `
SELECT count(*) FROM bridge.deliveries d
WHERE d.status IN ('pending', 'delivering')
  AND NOT EXISTS (SELECT 1 FROM bridge.delivery_streams st
                  WHERE st.subscription_id = d.subscription_id AND st.asset_key = coalesce(d.asset_id, '')
                    AND st.ready_at <> 'infinity')`).Scan(&stranded); err != nil {
		t.Fatal(err)
	}
	if stranded != 0 {
		t.Fatalf("%d open deliveries have no stream the claim looks at", stranded)
	}
	if n := drain(); n != 2*streams {
		t.Fatalf("claimed and delivered %d after pruning, want %d", n, 2*streams)
	}
}

// TestClaimSkipsASubscriptionAnotherClaimIsServing: while one claim's
// transaction holds a subscription, a second claim (another loop or
// replica) neither waits for it nor claims for it: it reports it contended.
// This is what keeps the per-subscription cap exact across claimers — the
// second claim can never count free slots the first is filling.
func TestClaimSkipsASubscriptionAnotherClaimIsServing(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSub(t, "https://example.com/hook")
	for i := range 6 {
		b.insert(t, sub.ID, fmt.Sprintf("a%d", i), 1, `{}`)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, claimLockSQL); err != nil {
		t.Fatal(err)
	}
	var held []string
	var contended int
	if err := tx.QueryRow(ctx, claimSubscriptionsSQL, 1, 0).Scan(&held, &contended, nil, nil, nil); err != nil || len(held) != 1 || contended != 0 {
		t.Fatalf("first claim holds %v (contended %d, %v); want the subscription", held, contended, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := b.store.ClaimShare(cctx, ClaimParams{ClaimedBy: "other", Limit: 10, MaxInFlight: 3, Lease: time.Minute})
	if err != nil || len(res.Claims) != 0 || res.Contended != 1 {
		t.Fatalf("second claim = %d rows, contended %d, %v; want 0 rows, contended 1, no wait", len(res.Claims), res.Contended, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	res, err = b.store.ClaimShare(ctx, ClaimParams{ClaimedBy: "other", Limit: 10, MaxInFlight: 3, Lease: time.Minute})
	if err != nil || len(res.Claims) != 3 || res.Contended != 0 {
		t.Fatalf("claim after the first ended = %d rows, contended %d, %v; want 3 (the cap)", len(res.Claims), res.Contended, err)
	}
}
