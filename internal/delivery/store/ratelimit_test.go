package store

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/testkit"
)

// The claim spends a rate-limited subscription's tokens, one per delivery it
// hands out, and hands out nothing (charging nothing) while the bucket has
// no whole token; it says when the next one is due. An unlimited
// subscription in the same claim is not held back.
func TestClaimSpendsTheRateLimitBucket(t *testing.T) {
	b, ctx := setup(t)
	limited, err := b.subs.Create(ctx, SubscriptionInput{URL: ptr("https://limited.example/in"), EventTypes: []string{"*"},
		RateLimit: ptr(10), RateBurst: ptr(3)})
	if err != nil {
		t.Fatal(err)
	}
	if limited.RateLimit != 10 || limited.RateBurst != 3 {
		t.Fatalf("created with rate %d burst %d; want 10 and 3", limited.RateLimit, limited.RateBurst)
	}
	free := b.createSub(t, "https://free.example/in")
	var ids []int64
	for i := range 8 {
		ids = append(ids, b.insert(t, limited.ID, fmt.Sprintf("a%d", i), 1, `{}`))
		b.insert(t, free.ID, fmt.Sprintf("a%d", i), 1, `{}`)
	}
	claim := func() ClaimResult {
		t.Helper()
		res, err := b.store.ClaimShare(ctx, ClaimParams{ClaimedBy: "w", Limit: 100, MaxInFlight: 100, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	count := func(cs []Claim, sub string) (n int) {
		for _, c := range cs {
			if c.SubscriptionID == sub {
				n++
			}
		}
		return n
	}
	// The bucket is refilled from the first claim's transaction time, which
	// is no earlier than this: every bound below counts from here, not from
	// when a claim returned (a slow first claim on a loaded machine is not
	// the refill running fast).
	firstBegan := time.Now()
	first := claim()
	if n := count(first.Claims, limited.ID); n != 3 {
		t.Fatalf("first claim took %d of the limited subscription's deliveries; want the burst, 3", n)
	}
	if n := count(first.Claims, free.ID); n != 8 {
		t.Fatalf("first claim took %d of the unlimited subscription's deliveries; want all 8", n)
	}
	// Three tokens spent, the bucket empty: the next is due in 1/10 s less
	// what refilled since.
	if first.RateWait <= 0 || first.RateWait > 100*time.Millisecond {
		t.Fatalf("rate wait after spending the burst = %s; want (0, 100ms]", first.RateWait)
	}
	// At once again: no whole token (unless 100 ms passed since the first
	// claim began, then at most one per 100 ms).
	again := claim()
	if n, allowed := count(again.Claims, limited.ID), tokensSince(firstBegan, 10); n > allowed {
		t.Fatalf("claim right after the burst took %d; want at most %d (10/s for %s)", n, allowed, time.Since(firstBegan))
	}
	// Waiting for a token is no attempt: the rows not claimed are untouched.
	untouched := 0
	for _, id := range ids {
		if r := b.get(t, id); r.Status == StatusPending && r.Attempts == 0 {
			untouched++
		}
	}
	if want := 8 - 3 - count(again.Claims, limited.ID); untouched != want {
		t.Fatalf("%d pending deliveries with 0 attempts; want %d", untouched, want)
	}
	// The bucket refills at 10/s: within a few hundred ms the next claims
	// get the rest, never more than the time allows.
	got := 3 + count(again.Claims, limited.ID)
	testkit.Eventually(t, 5*time.Second, func() string {
		res := claim()
		got += count(res.Claims, limited.ID)
		return testkit.Unless(got == 8, "%d of 8 claimed so far", got)
	})
	// 5 tokens after the burst at 10/s: the last is due 500 ms after the
	// first claim's transaction began (10 ms spared for the two clocks).
	if el := time.Since(firstBegan); el < 490*time.Millisecond {
		t.Fatalf("all 8 deliveries were claimed within %s of the first claim; at burst 3 + 10/s they take at least 500 ms", el)
	}
}

// tokensSince is how many whole tokens a bucket refilling at perSecond has
// gained since began, at most (measured now, after the claim returned).
func tokensSince(began time.Time, perSecond int) int {
	return int(time.Since(began).Seconds() * float64(perSecond))
}

// Bad rate limits are refused naming the field, and nothing is written.
func TestRateLimitIsCheckedWhereItEnters(t *testing.T) {
	b, ctx := setup(t)
	cases := []struct {
		limit, burst *int
		field        string
	}{
		{ptr(-1), nil, "rate-limit"},
		{ptr(MaxRateLimit + 1), nil, "rate-limit"},
		{ptr(10), ptr(0), "rate-burst"},
		{ptr(10), ptr(-3), "rate-burst"},
		{ptr(10), ptr(MaxRateBurst + 1), "rate-burst"},
		{ptr(0), ptr(5), "rate-burst"},
		{nil, ptr(5), "rate-burst"},
	}
	for _, c := range cases {
		_, err := b.subs.Create(ctx, SubscriptionInput{URL: ptr("https://x.example/in"), EventTypes: []string{"*"}, RateLimit: c.limit, RateBurst: c.burst})
		var ve *ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field {
			t.Errorf("create with rate %v burst %v = %v; want a ValidationError naming %s", deref2(c.limit), deref2(c.burst), err, c.field)
		}
	}
	if subs, err := b.subs.List(ctx); err != nil || len(subs) != 0 {
		t.Fatalf("after refused creates: %d subscriptions, %v; want none", len(subs), err)
	}
	sub := b.createSub(t, "https://x.example/in")
	if _, err := b.subs.Update(ctx, sub.ID, SubscriptionInput{RateBurst: ptr(4)}); err == nil {
		t.Fatal("update with a burst alone accepted; want it refused naming rate-burst")
	}
	up, err := b.subs.Update(ctx, sub.ID, SubscriptionInput{RateLimit: ptr(50)})
	if err != nil || up.RateLimit != 50 || up.RateBurst != DefaultRateBurst(50) {
		t.Fatalf("update to 50/s = %+v, %v; want rate 50, burst %d", up, err, DefaultRateBurst(50))
	}
	up, err = b.subs.Update(ctx, sub.ID, SubscriptionInput{RateLimit: ptr(0)})
	if err != nil || up.RateLimit != 0 || up.RateBurst != 0 {
		t.Fatalf("update to 0 = %+v, %v; want unlimited", up, err)
	}
}

func deref2(p *int) any {
	if p == nil {
		return "unset"
	}
	return *p
}
