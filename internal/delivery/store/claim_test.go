package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/testkit"
)

func claimOnce(t *testing.T, b *testBundle, by string, limit int) []Claim {
	t.Helper()
	cs, err := b.store.Claim(context.Background(), ClaimParams{ClaimedBy: by, Limit: limit, MaxInFlight: 100, Lease: time.Minute})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return cs
}

// claimAndCheck claims up to limit deliveries for by, then checks the
// claim's invariant on the table itself: no (subscription, asset) has two
// deliveries in flight. Workers call it from their own goroutines, so it
// returns what went wrong instead of failing the test.
func (b *testBundle) claimAndCheck(ctx context.Context, by string, limit, round int) ([]Claim, error) {
	cs, err := b.store.Claim(ctx, ClaimParams{ClaimedBy: by, Limit: limit, MaxInFlight: 100, Lease: time.Minute})
	if err != nil {
		return nil, err
	}
	var violations int
	if err := b.pool.QueryRow(ctx, `
SELECT count(*) FROM (
  SELECT subscription_id, coalesce(asset_id, '') FROM bridge.deliveries WHERE status = 'delivering'
  GROUP BY 1, 2 HAVING count(*) > 1) v`).Scan(&violations); err != nil {
		return nil, err
	}
	if violations > 0 {
		return nil, fmt.Errorf("round %d: %d streams with two deliveries in flight", round, violations)
	}
	return cs, nil
}

// wantOnlyClaimed claims and fails the test unless the claim is exactly the
// delivery want; when says at which step of the test.
func wantOnlyClaimed(t *testing.T, b *testBundle, when string, want int64) {
	t.Helper()
	if got := ids(claimOnce(t, b, "w", 10)); len(got) != 1 || got[0] != want {
		t.Fatalf("%s claimed %v, want only %d", when, got, want)
	}
}

func TestClaimTwoWorkersNeverHoldTwoDeliveriesOfOneStream(t *testing.T) {
	b, ctx := setup(t)
	subs := []*Subscription{b.createSub(t, "https://a.example/hook"), b.createSub(t, "https://b.example/hook")}
	const perStream = 15
	assets := []string{"", "a1", "a2", "a3"}
	total := 0
	for i := range perStream {
		for _, s := range subs {
			for _, a := range assets {
				b.insert(t, s.ID, a, i, `{}`)
				total++
			}
		}
	}

	// Several workers claim and complete concurrently, for as many rounds as
	// it takes to drain everything. After every claim each worker checks the
	// invariant on the table itself: no (subscription, asset) has two rows in
	// flight, and what is in flight is the stream's earliest open row.
	var mu sync.Mutex
	delivered := map[string][]int64{} // stream -> seqs in completion order
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for w := range 6 {
		wg.Go(func() {
			by := "worker-" + string(rune('a'+w))
			for round := 0; round < 2000; round++ {
				cs, err := b.claimAndCheck(ctx, by, 3, round)
				if err != nil {
					errs <- err
					return
				}
				for _, c := range cs {
					var earlier int
					if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries WHERE subscription_id = $1
  AND coalesce(asset_id, '') = coalesce($2, '') AND seq < $3 AND status IN ('pending', 'delivering')`,
						c.SubscriptionID, c.AssetID, c.Seq).Scan(&earlier); err != nil {
						errs <- err
						return
					}
					if earlier > 0 {
						errs <- fmt.Errorf("claimed seq %d while %d earlier rows of its stream are open", c.Seq, earlier)
						return
					}
					key := c.SubscriptionID + "/" + deref(c.AssetID)
					mu.Lock()
					delivered[key] = append(delivered[key], c.Seq)
					mu.Unlock()
					if _, err := b.store.Complete(ctx, &c, by, Outcome{StartedAt: time.Now(), StatusCode: 200}); err != nil {
						errs <- err
						return
					}
				}
				var open int
				if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries WHERE status <> 'delivered'`).Scan(&open); err != nil {
					errs <- err
					return
				}
				if open == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	n := 0
	for key, seqs := range delivered {
		n += len(seqs)
		for i := 1; i < len(seqs); i++ {
			if seqs[i] < seqs[i-1] {
				t.Errorf("stream %s completed out of order: %v", key, seqs)
				break
			}
		}
	}
	if n != total {
		t.Fatalf("delivered %d, want %d", n, total)
	}
}

func TestClaimHoldsLaterEventBehindEarlierWaitingToRetry(t *testing.T) {
	b, ctx := setup(t)
	s := b.createSub(t, "https://a.example/hook")
	first := b.insert(t, s.ID, "x", 1, `{}`)
	second := b.insert(t, s.ID, "x", 2, `{}`)
	other := b.insert(t, s.ID, "y", 1, `{}`)

	cs := claimOnce(t, b, "w", 10)
	if got := ids(cs); !sameSet(got, []int64{first, other}) {
		t.Fatalf("first claim = %v, want heads %v and %v", got, first, other)
	}
	// first fails and waits a minute to retry; y completes.
	for i := range cs {
		c := &cs[i]
		if c.ID == first {
			if _, err := b.store.Retry(ctx, c, "w", Outcome{StartedAt: time.Now(), StatusCode: 500, Error: "HTTP 500"}, time.Minute); err != nil {
				t.Fatal(err)
			}
		} else if _, err := b.store.Complete(ctx, c, "w", Outcome{StartedAt: time.Now(), StatusCode: 200}); err != nil {
			t.Fatal(err)
		}
	}
	if got := claimOnce(t, b, "w", 10); len(got) != 0 {
		t.Fatalf("claimed %v while the stream's head waits to retry; the later event must wait", ids(got))
	}
	// The retry comes due: the head goes out, and only then the second.
	// (Time passing, in SQL: the retry time and its stream's ready_at.)
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.deliveries SET next_attempt_at = now() WHERE id = $1`, first); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.delivery_streams SET ready_at = now(), gen = gen + 1`); err != nil {
		t.Fatal(err)
	}
	cs = claimOnce(t, b, "w", 10)
	if got := ids(cs); len(got) != 1 || got[0] != first {
		t.Fatalf("claim after retry came due = %v, want only %d", got, first)
	}
	if _, err := b.store.Complete(ctx, &cs[0], "w", Outcome{StartedAt: time.Now(), StatusCode: 200}); err != nil {
		t.Fatal(err)
	}
	wantOnlyClaimed(t, b, "claim", second)
}

func TestClaimNullAssetStreamIsOrdered(t *testing.T) {
	b, ctx := setup(t)
	s := b.createSub(t, "https://a.example/hook")
	var want []int64
	for i := range 5 {
		want = append(want, b.insert(t, s.ID, "", i, `{}`))
	}
	var got []int64
	for range 5 {
		cs := claimOnce(t, b, "w", 10)
		if len(cs) != 1 {
			t.Fatalf("claimed %d deliveries of the null-asset stream at once (%v); want exactly 1", len(cs), ids(cs))
		}
		got = append(got, cs[0].ID)
		if _, err := b.store.Complete(ctx, &cs[0], "w", Outcome{StartedAt: time.Now(), StatusCode: 200}); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("null-asset stream claimed in order %v, want %v", got, want)
	}
}

func TestClaimSkipsDisabledSubscription(t *testing.T) {
	b, ctx := setup(t)
	s := b.createSub(t, "https://a.example/hook")
	id := b.insert(t, s.ID, "x", 1, `{}`)
	if _, err := b.subs.Disable(ctx, s.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if got := claimOnce(t, b, "w", 10); len(got) != 0 {
		t.Fatalf("claimed %v for a disabled subscription", ids(got))
	}
	if r := b.get(t, id); r.Status != StatusPending {
		t.Fatalf("status = %s, want pending (waits for enable)", r.Status)
	}
	if _, err := b.subs.Enable(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	wantOnlyClaimed(t, b, "after enable", id)
}

func TestClaimBoundsInFlightPerSubscriptionAndIsFair(t *testing.T) {
	b, ctx := setup(t)
	busy := b.createSub(t, "https://busy.example/hook")
	quiet := b.createSub(t, "https://quiet.example/hook")
	for i := range 50 {
		b.insert(t, busy.ID, "asset-"+string(rune('A'+i%26))+string(rune('a'+i/26)), 1, `{}`)
	}
	q := b.insert(t, quiet.ID, "q", 1, `{}`)
	cs, err := b.store.Claim(ctx, ClaimParams{ClaimedBy: "w", Limit: 5, MaxInFlight: 3, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, c := range cs {
		per[c.SubscriptionID]++
	}
	if per[busy.ID] != 3 {
		t.Errorf("busy subscription got %d, want its cap of 3", per[busy.ID])
	}
	if per[quiet.ID] != 1 || !slices.Contains(ids(cs), q) {
		t.Errorf("quiet subscription got %d (want 1): a busy one must not starve it", per[quiet.ID])
	}
	// The busy subscription is at its cap: nothing more until one finishes.
	cs2, err := b.store.Claim(ctx, ClaimParams{ClaimedBy: "w", Limit: 5, MaxInFlight: 3, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs2) != 0 {
		t.Fatalf("claimed %d more while the subscription is at its in-flight cap", len(cs2))
	}
}

func TestReclaimStalledKeepsTheAttempt(t *testing.T) {
	b, ctx := setup(t)
	s := b.createSub(t, "https://a.example/hook")
	id := b.insert(t, s.ID, "x", 1, `{}`)
	cs, err := b.store.Claim(ctx, ClaimParams{ClaimedBy: "dead-worker", Limit: 1, MaxInFlight: 8, Lease: time.Millisecond})
	if err != nil || len(cs) != 1 {
		t.Fatalf("claim: %v %v", cs, err)
	}
	time.Sleep(5 * time.Millisecond) // let the 1ms lease run out (the thing under test is time)
	pending, dead, err := b.store.ReclaimStalled(ctx, 100, 9)
	if err != nil {
		t.Fatal(err)
	}
	if pending != 1 || dead != 0 {
		t.Fatalf("reclaimed pending=%d dead=%d, want 1, 0", pending, dead)
	}
	if r := b.get(t, id); r.Status != StatusPending || r.Attempts != 1 {
		t.Fatalf("after reclaim: %+v, want pending with attempts still 1 (the request may have arrived)", r)
	}
	// The dead worker's late answer changes nothing.
	if cur, err := b.store.Complete(ctx, &cs[0], "dead-worker", Outcome{StartedAt: time.Now(), StatusCode: 200}); err != nil || cur {
		t.Fatalf("late complete: current=%v err=%v, want a no-op", cur, err)
	}
	cs = claimOnce(t, b, "w2", 1)
	if len(cs) != 1 || cs[0].Attempts != 2 {
		t.Fatalf("re-claim = %+v, want attempts 2", cs)
	}
}

func TestReclaimStalledOnLastAttemptDies(t *testing.T) {
	b, ctx := setup(t)
	s := b.createSub(t, "https://a.example/hook")
	id := b.stalledOnLastAttempt(t, s.ID)
	time.Sleep(5 * time.Millisecond)
	if _, dead, err := b.store.ReclaimStalled(ctx, 100, 3); err != nil || dead != 1 {
		t.Fatalf("dead=%d err=%v, want 1", dead, err)
	}
	if r := b.get(t, id); r.Status != StatusDead {
		t.Fatalf("status = %s, want dead", r.Status)
	}
	if f := b.sub(t, s.ID).ConsecutiveFailures; f != 0 {
		t.Fatalf("consecutive_failures = %d; a stalled worker is not the endpoint's failure", f)
	}
}

func TestReleaseDoesNotChargeTheAttempt(t *testing.T) {
	b, ctx := setup(t)
	s := b.createSub(t, "https://a.example/hook")
	id := b.insert(t, s.ID, "x", 1, `{}`)
	id2 := b.insert(t, s.ID, "y", 1, `{}`)
	cs := claimOnce(t, b, "w", 10)
	if len(cs) != 2 {
		t.Fatalf("claimed %d, want 2", len(cs))
	}
	if err := b.store.Release(ctx, &cs[0], "w"); err != nil {
		t.Fatal(err)
	}
	if n, err := b.store.ReleaseAll(ctx, "w"); err != nil || n != 1 {
		t.Fatalf("release all = %d, %v; want 1", n, err)
	}
	for _, id := range []int64{id, id2} {
		if r := b.get(t, id); r.Status != StatusPending || r.Attempts != 0 {
			t.Fatalf("after release: %+v, want pending with 0 attempts", r)
		}
	}
}

func ids(cs []Claim) []int64 {
	out := make([]int64, len(cs))
	for i, c := range cs {
		out[i] = c.ID
	}
	return out
}

func sameSet(a, b []int64) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// The streams table is only a hint; these are the moments it must not hide a
// claimable head.
func TestClaimFindsStreamsWokenByInsertOutcomeAndRevive(t *testing.T) {
	b, ctx := setup(t)
	s := b.createSub(t, "https://a.example/hook")
	ok := Outcome{StartedAt: time.Now(), StatusCode: 200}

	// Emptied stream: its last row's success parks it ('infinity'); an
	// insert wakes it.
	b.insert(t, s.ID, "x", 1, `{}`)
	cs := claimOnce(t, b, "w", 10)
	if _, err := b.store.Complete(ctx, &cs[0], "w", ok); err != nil {
		t.Fatal(err)
	}
	var parked bool
	if err := b.pool.QueryRow(ctx, `SELECT ready_at = 'infinity' FROM bridge.delivery_streams WHERE asset_key = 'x'`).Scan(&parked); err != nil || !parked {
		t.Fatalf("stream after its last row's success: parked %v (%v), want parked", parked, err)
	}
	if got := claimOnce(t, b, "w", 10); len(got) != 0 {
		t.Fatalf("claimed %v from an empty stream", ids(got))
	}
	second := b.insert(t, s.ID, "x", 2, `{}`)
	wantOnlyClaimed(t, b, "after an insert into a parked stream", second)

	// In flight with a row behind: the claim parks it; the outcome wakes it.
	third := b.insert(t, s.ID, "x", 3, `{}`)
	if got := claimOnce(t, b, "w", 10); len(got) != 0 {
		t.Fatalf("claimed %v while the stream is in flight", ids(got))
	}
	var inFlight Claim
	inFlight.ID, inFlight.Attempts = second, 1
	if _, err := b.store.Complete(ctx, &inFlight, "w", ok); err != nil {
		t.Fatal(err)
	}
	cs = claimOnce(t, b, "w", 10)
	if got := ids(cs); len(got) != 1 || got[0] != third {
		t.Fatalf("after the outcome claimed %v, want %d", got, third)
	}

	// Dead, then revived: the revive wakes the stream.
	if _, err := b.store.Dead(ctx, &cs[0], "w", Outcome{StartedAt: time.Now(), StatusCode: 500, Error: "HTTP 500"}, 5, false); err != nil {
		t.Fatal(err)
	}
	if got := claimOnce(t, b, "w", 10); len(got) != 0 {
		t.Fatalf("claimed %v from a stream whose only row is dead", ids(got))
	}
	if _, _, err := b.store.Revive(ctx, []int64{third}); err != nil {
		t.Fatal(err)
	}
	wantOnlyClaimed(t, b, "after revive", third)
}

// Retries, deaths and revives running alongside the claims: a revive reopens
// a row in front of its stream, the case the claim's advisory lock and busy
// probe are for. The invariant must hold throughout, and everything must be
// delivered in the end (the streams hint must never hide a claimable head).
func TestClaimInvariantHoldsThroughRetriesDeathsAndRevives(t *testing.T) {
	b, ctx := setup(t)
	s := b.createSub(t, "https://a.example/hook")
	total := 0
	for i := range 20 {
		for _, a := range []string{"", "a1", "a2", "a3", "a4"} {
			b.insert(t, s.ID, a, i, `{}`)
			total++
		}
	}
	done := make(chan struct{})
	errs := make(chan error, 100)
	var died sync.Map // delivery id -> true: each dies once, then is revived and delivered
	var wg sync.WaitGroup
	wg.Go(func() { // the operator, reviving what died
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := b.store.ReviveSubscription(ctx, s.ID); err != nil {
				errs <- err
				return
			}
		}
	})
	for w := range 4 {
		wg.Go(func() {
			by := fmt.Sprintf("worker-%d", w)
			for round := 0; round < 3000; round++ {
				cs, err := b.claimAndCheck(ctx, by, 4, round)
				if err != nil {
					errs <- err
					return
				}
				for i := range cs {
					c := &cs[i]
					o := Outcome{StartedAt: time.Now(), StatusCode: 500, Error: "HTTP 500"}
					_, diedBefore := died.Load(c.ID)
					switch {
					case c.Seq%7 == 0 && !diedBefore:
						died.Store(c.ID, true)
						_, err = b.store.Dead(ctx, c, by, o, 1_000_000, false)
					case c.Seq%5 == 0 && c.Attempts == 1:
						_, err = b.store.Retry(ctx, c, by, o, 0)
					default:
						_, err = b.store.Complete(ctx, c, by, Outcome{StartedAt: time.Now(), StatusCode: 200})
					}
					if err != nil {
						errs <- err
						return
					}
				}
				var delivered int
				if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries WHERE status = 'delivered'`).Scan(&delivered); err != nil {
					errs <- err
					return
				}
				if delivered == total {
					return
				}
			}
		})
	}
	// Wait for the workers (they return when all is delivered), then the reviver.
	defer func() {
		if t.Failed() {
			rows, _ := b.pool.Query(ctx, `SELECT d.id, d.seq, coalesce(d.asset_id, '-'), d.status, d.attempts, d.next_attempt_at <= now(), st.ready_at, st.gen
FROM bridge.deliveries d LEFT JOIN bridge.delivery_streams st ON st.subscription_id = d.subscription_id AND st.asset_key = coalesce(d.asset_id, '')
WHERE d.status <> 'delivered' ORDER BY d.seq`)
			for rows.Next() {
				vals, _ := rows.Values()
				t.Logf("open: %v", vals)
			}
			rows.Close()
		}
	}()
	testkit.Eventually(t, 60*time.Second, func() string {
		var delivered int
		_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries WHERE status = 'delivered'`).Scan(&delivered)
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		return testkit.Unless(delivered == total, "every delivery to be delivered")
	})
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// The claim is sent with its COMMIT, so a claim whose rows this process
// cannot read is committed before it knows. Its rows must not wait a lease
// 'delivering' with an attempt charged for a request never sent: they are
// given back at once, uncharged, and the next claim takes them.
func TestClaimThatCannotBeReadIsGivenBack(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSub(t, "https://a.example/hook")
	ids := []int64{b.insert(t, sub.ID, "a", 1, `{}`), b.insert(t, sub.ID, "b", 1, `{}`)}
	broken := NewDeliveryStore(b.pool)
	broken.readClaims = func(rows pgx.Rows) ([]Claim, error) {
		return nil, errors.New("row does not fit Claim")
	}
	if _, err := broken.Claim(ctx, ClaimParams{ClaimedBy: "w", Limit: 10, MaxInFlight: 8, Lease: time.Hour}); err == nil ||
		!strings.Contains(err.Error(), "row does not fit Claim") {
		t.Fatalf("claim that cannot be read: err = %v, want the read error", err)
	}
	for _, id := range ids {
		if r := b.get(t, id); r.Status != StatusPending || r.Attempts != 0 {
			t.Fatalf("delivery %d after a claim that could not be read: %s with %d attempts, want pending with 0", id, r.Status, r.Attempts)
		}
	}
	if cs := claimOnce(t, b, "w", 10); len(cs) != 2 || cs[0].Attempts != 1 {
		t.Fatalf("next claim: %d claims (first attempt %v), want both, on their first attempt", len(cs), cs)
	}
}
