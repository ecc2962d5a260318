package store

import (
	"testing"
)

// bridge.subscriptions_version moves with every change to what the fast
// lane routes by or posts to, in that change's transaction, and not with the
// delivery path's own updates of bridge.subscriptions (the claim's rate
// tokens, the outcomes' failure count): those run statement after statement
// and would turn every version check into a full read of the routes.
func TestRoutesVersionMovesWithRoutingChangesOnly(t *testing.T) {
	b, ctx := setup(t)
	version := func() int64 {
		t.Helper()
		v, err := b.store.CheckRoutes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return v.Version
	}
	last := version()
	step := func(what string, moves bool, do func() error) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		v := version()
		if moved := v != last; moved != moves {
			t.Errorf("%s: version %d → %d, want moved=%v", what, last, v, moves)
		}
		last = v
	}
	var sub *Subscription
	step("create", true, func() (err error) {
		url := "https://example.com/hook"
		sub, err = b.subs.Create(ctx, SubscriptionInput{URL: &url, EventTypes: []string{"*"}})
		return err
	})
	exec := func(sql string) func() error {
		return func() error { _, err := b.pool.Exec(ctx, sql, sub.ID); return err }
	}
	step("rate tokens spent", false, exec(`UPDATE bridge.subscriptions SET rate_tokens = rate_tokens - 1, rate_refilled_at = now() WHERE id = $1`))
	step("a failure counted", false, exec(`UPDATE bridge.subscriptions SET consecutive_failures = consecutive_failures + 1, enabled = enabled, updated_at = now() WHERE id = $1`))
	step("history progress", false, exec(`UPDATE bridge.subscriptions SET history_copied = history_copied + 1 WHERE id = $1`))
	step("secret rotated", false, func() error { _, err := b.subs.RotateSecret(ctx, sub.ID); return err })
	step("url changed", true, func() error {
		url := "https://example.com/other"
		_, err := b.subs.Update(ctx, sub.ID, SubscriptionInput{URL: &url})
		return err
	})
	step("event types changed", true, func() error {
		_, err := b.subs.Update(ctx, sub.ID, SubscriptionInput{EventTypes: []string{"asset.created"}})
		return err
	})
	step("topic set", true, func() error {
		_, err := b.subs.Update(ctx, sub.ID, SubscriptionInput{Topic: ptr("assets")})
		return err
	})
	step("rate limit set", true, func() error {
		_, err := b.subs.Update(ctx, sub.ID, SubscriptionInput{RateLimit: ptr(5)})
		return err
	})
	step("description changed", false, func() error {
		_, err := b.subs.Update(ctx, sub.ID, SubscriptionInput{Description: ptr("x")})
		return err
	})
	step("disabled", true, func() error { _, err := b.subs.Disable(ctx, sub.ID, "test"); return err })
	step("enabled", true, func() error { _, err := b.subs.Enable(ctx, sub.ID); return err })
	step("history finished", true, exec(`UPDATE bridge.subscriptions SET history_done_at = now() WHERE id = $1`))
	step("deleted", true, func() error { return b.subs.Delete(ctx, sub.ID) })
}
