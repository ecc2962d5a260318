package store

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

const testOps = "bridge.operations"

type announced struct {
	EventType string
	AssetID   string
	Payload   json.RawMessage
}

// announcements reads the operational events in bridge.outbox, in relay order.
func (b *testBundle) announcements(t *testing.T) []announced {
	t.Helper()
	return pgtest.Structs[announced](t, b.pool,
		`SELECT event_type, coalesce(asset_id, ''), payload FROM bridge.outbox WHERE topic = $1 ORDER BY seq`, testOps)
}

func types(as []announced) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.EventType)
	}
	return out
}

// die claims delivery id's stream head and records its death.
func (b *testBundle) die(t *testing.T, gone bool, disableAfter int) DeadResult {
	t.Helper()
	ctx := context.Background()
	cs, err := b.store.Claim(ctx, ClaimParams{ClaimedBy: "w", Limit: 1, MaxInFlight: 8, Lease: time.Minute})
	if err != nil || len(cs) != 1 {
		t.Fatalf("claim: %v (%d claims)", err, len(cs))
	}
	status := 500
	if gone {
		status = 410
	}
	r, err := b.store.Dead(ctx, &cs[0], "w", Outcome{StartedAt: time.Now(), StatusCode: status, Error: "HTTP 500"}, disableAfter, gone)
	if err != nil || !r.Current {
		t.Fatalf("dead: %+v %v", r, err)
	}
	return r
}

// TestDeathsAnnounceTheStagedWarningsAndTheDisable: with
// WEBHOOK_DISABLE_AFTER=10, deaths 1..10 announce ten bridge.delivery.dead
// events, the failing warnings at the 5th (50%), 7th (70%) and 9th (90%)
// death — each once — and the disable at the 10th, in that order, all keyed
// by the subscription. A death recorded for a claim that is no longer
// current announces nothing.
func TestDeathsAnnounceTheStagedWarningsAndTheDisable(t *testing.T) {
	b, _ := setup(t)
	b.store.Operations = testOps
	s := b.createSub(t, "https://a.example/hook")
	for i := 1; i <= 10; i++ {
		b.insert(t, s.ID, "x", i, `{}`)
		b.die(t, false, 10)
	}
	got := b.announcements(t)
	var want []string
	for i := 1; i <= 10; i++ {
		want = append(want, contract.OpDeliveryDead)
		switch i {
		case 5, 7, 9:
			want = append(want, contract.OpSubscriptionFailing)
		case 10:
			want = append(want, contract.OpSubscriptionDisabled)
		}
	}
	if !slices.Equal(types(got), want) {
		t.Fatalf("announced %v\nwant %v", types(got), want)
	}
	var percents []int
	for _, a := range got {
		if a.AssetID != contract.OperationsAssetForSubscription(s.ID) {
			t.Errorf("%s keyed %q", a.EventType, a.AssetID)
		}
		if a.EventType == contract.OpSubscriptionFailing {
			var f contract.SubscriptionFailing
			if err := json.Unmarshal(a.Payload, &f); err != nil {
				t.Fatal(err)
			}
			percents = append(percents, f.Percent)
		}
	}
	if !slices.Equal(percents, []int{50, 70, 90}) {
		t.Errorf("warning levels %v, want [50 70 90]", percents)
	}
	var d contract.SubscriptionDisabled
	if err := json.Unmarshal(got[len(got)-1].Payload, &d); err != nil {
		t.Fatal(err)
	}
	if d.Cause != contract.CauseFailures || d.ConsecutiveFailures != 10 || d.DisabledAt.IsZero() {
		t.Errorf("disabled payload %s", got[len(got)-1].Payload)
	}
}

// TestGoneAnnouncesTheDeathAndTheDisable: one 410 announces the death
// (cause gone) and the disable (cause gone) in its transaction.
func TestGoneAnnouncesTheDeathAndTheDisable(t *testing.T) {
	b, _ := setup(t)
	b.store.Operations = testOps
	s := b.createSub(t, "https://a.example/hook")
	b.insert(t, s.ID, "x", 1, `{}`)
	if r := b.die(t, true, 5); !r.DisabledNow {
		t.Fatalf("410 did not disable: %+v", r)
	}
	got := b.announcements(t)
	if !slices.Equal(types(got), []string{contract.OpDeliveryDead, contract.OpSubscriptionDisabled}) {
		t.Fatalf("announced %v", types(got))
	}
	var dead contract.DeliveryDead
	var dis contract.SubscriptionDisabled
	_ = json.Unmarshal(got[0].Payload, &dead)
	_ = json.Unmarshal(got[1].Payload, &dis)
	if dead.Cause != contract.CauseGone || dead.StatusCode != 410 || dis.Cause != contract.CauseGone || dis.Reason != "endpoint answered 410 Gone" {
		t.Errorf("payloads %s %s", got[0].Payload, got[1].Payload)
	}
}

// TestDeathOfAnOperationalEventIsNotAnnounced is the feedback-loop guard at
// its source: neither a delivery from the operations topic nor one of an
// operational event type announces its death (the warning its count reaches
// still does).
func TestDeathOfAnOperationalEventIsNotAnnounced(t *testing.T) {
	b, ctx := setup(t)
	b.store.Operations = testOps
	s := b.createSub(t, "https://a.example/hook")
	for i, q := range []string{
		`UPDATE bridge.deliveries SET topic = 'bridge.operations' WHERE id = $1`,
		`UPDATE bridge.deliveries SET event_type = 'bridge.delivery.dead' WHERE id = $1`,
	} {
		id := b.insert(t, s.ID, "x", i+1, `{}`)
		if _, err := b.pool.Exec(ctx, q, id); err != nil {
			t.Fatal(err)
		}
		b.die(t, false, 4)
	}
	if got := types(b.announcements(t)); !slices.Equal(got, []string{contract.OpSubscriptionFailing}) {
		t.Fatalf("announced %v, want only the 50%% warning", got)
	}
}

// TestReclaimedLastAttemptAnnouncesTheDeath: a delivery whose last allowed
// attempt's lease ran out dies in the reclaim, which announces it (cause
// lease) in its own transaction; the endpoint's count does not move, so no
// warning.
func TestReclaimedLastAttemptAnnouncesTheDeath(t *testing.T) {
	b, ctx := setup(t)
	b.store.Operations = testOps
	s := b.createSub(t, "https://a.example/hook")
	id := b.stalledOnLastAttempt(t, s.ID)
	var dead int
	for dead == 0 { // the lease is a millisecond: wait for it to run out
		var err error
		if _, dead, err = b.store.ReclaimStalled(ctx, 100, 3); err != nil {
			t.Fatal(err)
		}
	}
	got := b.announcements(t)
	if !slices.Equal(types(got), []string{contract.OpDeliveryDead}) {
		t.Fatalf("announced %v", types(got))
	}
	var d contract.DeliveryDead
	_ = json.Unmarshal(got[0].Payload, &d)
	if d.Cause != contract.CauseLease || d.DeliveryID != id || d.Attempts != 3 || d.SubscriptionID != s.ID {
		t.Errorf("payload %s", got[0].Payload)
	}
}

// TestOperatorChangesAnnounceTransitionsOnly: disable announces (cause
// operator) only when it disables, enable only when it re-enables, and a
// rotation announces when the rotated-out secret stops signing — never a
// secret.
func TestOperatorChangesAnnounceTransitionsOnly(t *testing.T) {
	b, ctx := setup(t)
	b.subs.Operations = testOps
	s := b.createSub(t, "https://a.example/hook")
	steps := []func() error{
		func() error { _, err := b.subs.Enable(ctx, s.ID); return err },                 // already enabled: nothing
		func() error { _, err := b.subs.Disable(ctx, s.ID, "maintenance"); return err }, // announced
		func() error { _, err := b.subs.Disable(ctx, s.ID, "again"); return err },       // already disabled: nothing
		func() error { _, err := b.subs.Enable(ctx, s.ID); return err },                 // announced
		func() error { _, err := b.subs.RotateSecret(ctx, s.ID); return err },           // announced
	}
	for i, f := range steps {
		if err := f(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	got := b.announcements(t)
	want := []string{contract.OpSubscriptionDisabled, contract.OpSubscriptionEnabled, contract.OpSubscriptionSecretRotated}
	if !slices.Equal(types(got), want) {
		t.Fatalf("announced %v, want %v", types(got), want)
	}
	var dis contract.SubscriptionDisabled
	var en contract.SubscriptionEnabled
	var rot contract.SubscriptionSecretRotated
	_ = json.Unmarshal(got[0].Payload, &dis)
	_ = json.Unmarshal(got[1].Payload, &en)
	_ = json.Unmarshal(got[2].Payload, &rot)
	if dis.Cause != contract.CauseOperator || dis.Reason != "maintenance" {
		t.Errorf("disabled payload %s", got[0].Payload)
	}
	if en.PreviousReason != "again" {
		t.Errorf("enabled payload %s", got[1].Payload)
	}
	if d := rot.PreviousExpiresAt.Sub(rot.RotatedAt); d != time.Hour {
		t.Errorf("rotated payload %s: grace %v, want 1h", got[2].Payload, d)
	}
	if strings.Contains(string(got[2].Payload), SecretPrefix) {
		t.Errorf("rotation announcement carries a secret: %s", got[2].Payload)
	}
	// An unknown subscription changes nothing and announces nothing.
	if _, err := b.subs.Disable(ctx, "6f1c1f0e-0000-4000-8000-000000000000", ""); err == nil {
		t.Error("disable of an unknown subscription succeeded")
	}
	if n := len(b.announcements(t)); n != 3 {
		t.Errorf("%d announcements after a failed disable, want 3", n)
	}
}
