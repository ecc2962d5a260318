package delivery

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/testkit"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

const waitLong = 20 * time.Second

func (b *testBundle) waitStatus(t *testing.T, id int64, status string) *store.Delivery {
	t.Helper()
	var r *store.Delivery
	testkit.Eventually(t, waitLong, func() string {
		r = b.get(t, id)
		return testkit.Unless(r.Status == status, "%s", "delivery to be "+status)
	})
	return r
}

func (b *testBundle) attempts(t *testing.T, id int64) []store.Attempt {
	t.Helper()
	as, err := b.store.Attempts(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return as
}

func TestSignaturesVerifyWithStandardWebhooksIncludingDuringRotation(t *testing.T) {
	b := setup(t)
	rc := newReceiver(t, nil)
	sub := b.createSub(t, rc.URL+"/hook")
	if !strings.HasPrefix(sub.Secret, "whsec_") {
		t.Fatalf("secret %q does not start with whsec_", sub.Secret)
	}
	oldSecret := sub.Secret
	b.runDeliverer(t, Config{})

	id := b.insert(t, sub.ID, "a", 1, `{"n": 1}`)
	b.waitStatus(t, id, store.StatusDelivered)
	verify := func(r received, secret string) error {
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil {
			t.Fatal(err)
		}
		return wh.Verify(r.Body, r.Header)
	}
	first := rc.requests()[0]
	if err := verify(first, oldSecret); err != nil {
		t.Fatalf("official verifier rejects the signature: %v (header %q)", err, first.Header.Get("webhook-signature"))
	}

	rotated, err := b.subs.RotateSecret(context.Background(), sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rotated.Secret == oldSecret || !strings.HasPrefix(rotated.Secret, "whsec_") {
		t.Fatalf("rotation returned secret %q", rotated.Secret)
	}
	id2 := b.insert(t, sub.ID, "a", 2, `{"n": 2}`)
	b.waitStatus(t, id2, store.StatusDelivered)
	second := rc.requests()[1]
	if n := len(strings.Fields(second.Header.Get("webhook-signature"))); n != 2 {
		t.Fatalf("during the grace period the request carries %d signatures, want 2", n)
	}
	for name, secret := range map[string]string{"previous": oldSecret, "new": rotated.Secret} {
		if err := verify(second, secret); err != nil {
			t.Errorf("during rotation the %s secret does not verify: %v", name, err)
		}
	}
	if second.Env.ID != second.Header.Get("webhook-id") {
		t.Errorf("webhook-id %q is not the event id %q", second.Header.Get("webhook-id"), second.Env.ID)
	}
	if ua := second.Header.Get("user-agent"); !strings.HasPrefix(ua, "outbox-bridge/") {
		t.Errorf("user-agent = %q", ua)
	}
	if ct := second.Header.Get("content-type"); ct != "application/json" {
		t.Errorf("content-type = %q", ct)
	}
}

func TestTraceparentTravelsWithoutSDK(t *testing.T) {
	b := setup(t)
	rc, sub := b.endpoint(t, nil)
	b.runDeliverer(t, Config{}) // no TracerProvider: the global no-op one
	id := b.insert(t, sub.ID, "a", 1, `{}`)
	b.waitStatus(t, id, store.StatusDelivered)
	tp := rc.requests()[0].Header.Get("traceparent")
	if !strings.HasPrefix(tp, "00-4bf92f3577b34da6a3ce929d0e0e4736-") {
		t.Fatalf("traceparent = %q, want the stored trace id 4bf92f3577b34da6a3ce929d0e0e4736", tp)
	}
	if as := b.attempts(t, id); len(as) != 1 || as[0].TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("attempt log trace id = %+v", as)
	}
}

func TestEnvelopeIsExactlyTheContract(t *testing.T) {
	b := setup(t)
	rc, sub := b.endpoint(t, nil)
	ctx := t.Context()
	var withAsset, nullAsset int64
	err := b.pool.QueryRow(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at)
VALUES ($1, 'evt-1', 'asset.updated', 'assets', 'a1', 7, '{"b": [1, 2], "a": "<x>"}', '2024-05-01T12:34:56.789Z') RETURNING id`, sub.ID).Scan(&withAsset)
	if err != nil {
		t.Fatal(err)
	}
	err = b.pool.QueryRow(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at)
VALUES ($1, 'evt-2', 'tick', 'assets', NULL, 3, '[]', '2024-05-01T12:00:00Z') RETURNING id`, sub.ID).Scan(&nullAsset)
	if err != nil {
		t.Fatal(err)
	}
	b.runDeliverer(t, Config{})
	b.waitStatus(t, withAsset, store.StatusDelivered)
	b.waitStatus(t, nullAsset, store.StatusDelivered)
	want := map[string]string{
		"evt-1": `{"id":"evt-1","type":"asset.updated","asset_id":"a1","asset_seq":7,"timestamp":"2024-05-01T12:34:56.789Z","data":{"a":"<x>","b":[1,2]}}`,
		"evt-2": `{"id":"evt-2","type":"tick","asset_id":null,"asset_seq":3,"timestamp":"2024-05-01T12:00:00Z","data":[]}`,
	}
	for _, r := range rc.requests() {
		id := r.Header.Get("webhook-id")
		if string(r.Body) != want[id] {
			t.Errorf("body of %s:\n got %s\nwant %s", id, r.Body, want[id])
		}
	}
}

func TestDeadIncrementsFailureCountButARetriedAttemptDoesNot(t *testing.T) {
	b := setup(t)
	release := make(chan struct{})
	var once sync.Once
	rc := newReceiver(t, func(r *received, n int) int {
		if strings.Contains(string(r.Env.Data), "bad") {
			if n == 2 {
				<-release // hold the second attempt until the test has looked
			}
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	sub := b.createSub(t, rc.URL)
	b.runDeliverer(t, Config{RetrySchedule: []time.Duration{300 * time.Millisecond}})
	bad := b.insert(t, sub.ID, "x", 1, `{"v": "bad"}`)
	behind := b.insert(t, sub.ID, "x", 2, `{"v": "good"}`)

	// The first attempt failed and waits for its retry: it must not count.
	testkit.Eventually(t, waitLong, func() string { return testkit.Unless(len(b.attempts(t, bad)) == 1, "the first attempt to be recorded") })
	if f := b.sub(t, sub.ID).ConsecutiveFailures; f != 0 {
		t.Fatalf("a failed attempt that will be retried moved consecutive_failures to %d", f)
	}
	once.Do(func() { close(release) })
	r := b.waitStatus(t, bad, store.StatusDead)
	if r.Attempts != 2 {
		t.Fatalf("dead after %d attempts, want 2 (schedule of one retry)", r.Attempts)
	}
	if as := b.attempts(t, bad); len(as) != 2 || *as[0].StatusCode != 500 {
		t.Fatalf("attempt log = %+v", as)
	}
	// The rows behind a dead delivery proceed.
	b.waitStatus(t, behind, store.StatusDelivered)
	// The success behind the death reset the count.
	if f := b.sub(t, sub.ID).ConsecutiveFailures; f != 0 {
		t.Fatalf("consecutive_failures = %d after a success, want 0", f)
	}
}

func TestFailureCountMovesOnlyOnDeath(t *testing.T) {
	b := setup(t)
	ctx := t.Context()
	s := b.createSub(t, "https://a.example/hook")
	id := b.insert(t, s.ID, "x", 1, `{}`)
	fail := store.Outcome{StartedAt: time.Now(), StatusCode: 500, Error: "HTTP 500"}
	cs := claimOnce(t, b, "w", 1)
	if _, err := b.store.Retry(ctx, &cs[0], "w", fail, 0); err != nil {
		t.Fatal(err)
	}
	if f := b.sub(t, s.ID).ConsecutiveFailures; f != 0 {
		t.Fatalf("a failed attempt that will be retried moved consecutive_failures to %d", f)
	}
	cs = claimOnce(t, b, "w", 1)
	r, err := b.store.Dead(ctx, &cs[0], "w", fail, 5, false)
	if err != nil || !r.Current || r.ConsecutiveFailures != 1 || !r.Enabled || r.DisabledNow {
		t.Fatalf("dead = %+v, %v; want current, 1 failure, still enabled", r, err)
	}
	if st := b.get(t, id).Status; st != store.StatusDead {
		t.Fatalf("status %s", st)
	}
	// Success resets it.
	b.insert(t, s.ID, "x", 2, `{}`)
	cs = claimOnce(t, b, "w", 1)
	if _, err := b.store.Complete(ctx, &cs[0], "w", store.Outcome{StartedAt: time.Now(), StatusCode: 204}); err != nil {
		t.Fatal(err)
	}
	if f := b.sub(t, s.ID).ConsecutiveFailures; f != 0 {
		t.Fatalf("success left consecutive_failures at %d", f)
	}
}

func TestSuccessResetsFailureCount(t *testing.T) {
	b := setup(t)
	_, sub := b.endpoint(t, nil)
	if _, err := b.pool.Exec(context.Background(), `UPDATE bridge.subscriptions SET consecutive_failures = 4 WHERE id = $1`, sub.ID); err != nil {
		t.Fatal(err)
	}
	b.runDeliverer(t, Config{})
	id := b.insert(t, sub.ID, "a", 1, `{}`)
	b.waitStatus(t, id, store.StatusDelivered)
	if f := b.sub(t, sub.ID).ConsecutiveFailures; f != 0 {
		t.Fatalf("consecutive_failures = %d after a success, want 0", f)
	}
}

func TestAutoDisableAtThreshold(t *testing.T) {
	b := setup(t)
	rc, sub := b.endpoint(t, func(*received, int) int { return http.StatusInternalServerError })
	m := &countingMetrics{}
	b.runDeliverer(t, Config{RetrySchedule: []time.Duration{}, DisableAfter: 3, Metrics: m})
	var ids []int64
	for i := range 2 {
		ids = append(ids, b.insert(t, sub.ID, "a", i, `{}`))
	}
	for _, id := range ids {
		b.waitStatus(t, id, store.StatusDead)
	}
	if s := b.sub(t, sub.ID); !s.Enabled || s.ConsecutiveFailures != 2 {
		t.Fatalf("after 2 deaths: enabled=%v failures=%d; want enabled with 2", s.Enabled, s.ConsecutiveFailures)
	}
	third := b.insert(t, sub.ID, "a", 2, `{}`)
	b.waitStatus(t, third, store.StatusDead)
	s := b.sub(t, sub.ID)
	if s.Enabled || s.ConsecutiveFailures != 3 || !strings.Contains(s.DisabledReason, "3 consecutive deliveries dead") || s.DisabledAt == nil {
		t.Fatalf("after 3 deaths: %+v; want disabled with a reason", s)
	}
	if outcomes, disabled := m.snapshot(); outcomes["dead"] != 3 || disabled != 1 {
		t.Fatalf("metrics saw outcomes %v and %d disables; want 3 dead, 1 disable", outcomes, disabled)
	}
	// A disabled subscription's deliveries wait.
	fourth := b.insert(t, sub.ID, "b", 1, `{}`)
	n := len(rc.requests())
	time.Sleep(300 * time.Millisecond) // several poll intervals: asserting that nothing happens
	if st := b.get(t, fourth).Status; st != store.StatusPending || len(rc.requests()) != n {
		t.Fatalf("delivery for a disabled subscription: status %s, requests %d→%d", st, n, len(rc.requests()))
	}
}

func TestGoneDisablesAtOnce(t *testing.T) {
	b := setup(t)
	_, sub := b.endpoint(t, func(*received, int) int { return http.StatusGone })
	b.runDeliverer(t, Config{RetrySchedule: []time.Duration{0, 0, 0}})
	first := b.insert(t, sub.ID, "a", 1, `{}`)
	second := b.insert(t, sub.ID, "a", 2, `{}`)
	r := b.waitStatus(t, first, store.StatusDead)
	if r.Attempts != 1 {
		t.Fatalf("410 retried: %d attempts", r.Attempts)
	}
	s := b.sub(t, sub.ID)
	if s.Enabled || !strings.Contains(s.DisabledReason, "410") {
		t.Fatalf("after 410: enabled=%v reason=%q", s.Enabled, s.DisabledReason)
	}
	if st := b.get(t, second).Status; st != store.StatusPending {
		t.Fatalf("second delivery status %s, want pending (subscription disabled)", st)
	}
}

func TestReviveResetsAttemptsAndDeliversInOrder(t *testing.T) {
	b := setup(t)
	var healthy atomic.Bool
	rc, sub := b.endpoint(t, func(*received, int) int {
		if healthy.Load() {
			return http.StatusOK
		}
		return http.StatusServiceUnavailable
	})
	b.runDeliverer(t, Config{RetrySchedule: []time.Duration{0}})
	var ids []int64
	for i := 1; i <= 4; i++ {
		ids = append(ids, b.insert(t, sub.ID, "x", i, `{}`))
	}
	for _, id := range ids {
		if r := b.waitStatus(t, id, store.StatusDead); r.Attempts != 2 {
			t.Fatalf("dead after %d attempts, want 2", r.Attempts)
		}
	}
	healthy.Store(true)
	before := len(rc.requests())
	// Revive one by id, the rest by subscription.
	if got, _, err := b.store.Revive(context.Background(), []int64{ids[0]}); err != nil || len(got) != 1 {
		t.Fatalf("revive = %v, %v", got, err)
	}
	if got, err := b.store.ReviveSubscription(context.Background(), sub.ID); err != nil || len(got) != 3 {
		t.Fatalf("revive subscription = %v, %v", got, err)
	}
	for _, id := range ids {
		if r := b.waitStatus(t, id, store.StatusDelivered); r.Attempts != 1 {
			t.Fatalf("revived delivery took %d attempts, want 1 (attempts reset to 0, then one)", r.Attempts)
		}
	}
	var order []int64
	for _, r := range rc.requests()[before:] {
		order = append(order, r.Env.AssetSeq)
	}
	if want := []int64{1, 2, 3, 4}; !slices.Equal(order, want) {
		t.Fatalf("revived deliveries arrived in order %v, want %v", order, want)
	}
}

func TestLaterEventNeverDeliveredBeforeEarlierWaitingToRetry(t *testing.T) {
	b := setup(t)
	rc, sub := b.endpoint(t, func(_ *received, n int) int {
		if n <= 2 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	b.runDeliverer(t, Config{RetrySchedule: []time.Duration{200 * time.Millisecond, 200 * time.Millisecond}})
	var ids []int64
	for i := 1; i <= 5; i++ {
		ids = append(ids, b.insert(t, sub.ID, "x", i, `{}`))
	}
	for _, id := range ids {
		b.waitStatus(t, id, store.StatusDelivered)
	}
	var order []int64
	for _, r := range rc.requests() {
		order = append(order, r.Env.AssetSeq)
	}
	if want := []int64{1, 1, 1, 2, 3, 4, 5}; !slices.Equal(order, want) {
		t.Fatalf("requests arrived in order %v, want %v", order, want)
	}
}

func TestRedirectsAreNotFollowed(t *testing.T) {
	b := setup(t)
	target := newReceiver(t, nil)
	redirect := newRedirector(t, target.URL)
	sub := b.createSub(t, redirect.URL)
	b.runDeliverer(t, Config{RetrySchedule: []time.Duration{}})
	id := b.insert(t, sub.ID, "a", 1, `{}`)
	b.waitStatus(t, id, store.StatusDead)
	if n := len(target.requests()); n != 0 {
		t.Fatalf("the redirect target received %d requests", n)
	}
	as := b.attempts(t, id)
	if len(as) != 1 || as[0].StatusCode == nil || *as[0].StatusCode != http.StatusFound || !strings.Contains(as[0].Error, "redirect") {
		t.Fatalf("attempt = %+v, want a 302 counted as failure", as)
	}
}

func TestRefusedAddressFailsTheAttemptNamingIt(t *testing.T) {
	b := setup(t)
	rc, sub := b.endpoint(t, nil)
	b.runDeliverer(t, Config{RetrySchedule: []time.Duration{}, AllowedCIDRs: []netip.Prefix{}})
	id := b.insert(t, sub.ID, "a", 1, `{}`)
	b.waitStatus(t, id, store.StatusDead)
	if n := len(rc.requests()); n != 0 {
		t.Fatalf("a loopback receiver was reached %d times without WEBHOOK_ALLOWED_CIDRS", n)
	}
	as := b.attempts(t, id)
	if len(as) != 1 || !strings.Contains(as[0].Error, "127.0.0.1") || !strings.Contains(as[0].Error, "SSRF") || as[0].StatusCode != nil {
		t.Fatalf("attempt = %+v, want a refusal naming 127.0.0.1", as)
	}
}

func TestShutdownReleasesInFlightWithoutCharging(t *testing.T) {
	b := setup(t)
	unblock := make(chan struct{})
	rc := newReceiver(t, func(*received, int) int {
		<-unblock
		return http.StatusOK
	})
	t.Cleanup(func() { close(unblock) }) // runs before the receiver's Close
	sub := b.createSub(t, rc.URL)
	_, stop := b.runDeliverer(t, Config{ShutdownGrace: 100 * time.Millisecond})
	id := b.insert(t, sub.ID, "a", 1, `{}`)
	testkit.Eventually(t, waitLong, func() string { return testkit.Unless(len(rc.requests()) == 1, "the request to arrive") })
	if err := stop(); err != nil {
		t.Fatalf("Run returned %v on a clean shutdown, want nil", err)
	}
	r := b.get(t, id)
	if r.Status != store.StatusPending || r.Attempts != 0 {
		t.Fatalf("after shutdown: %+v, want pending with 0 attempts (a deploy costs no attempt)", r)
	}
	if as := b.attempts(t, id); len(as) != 0 {
		t.Fatalf("shutdown logged attempts %+v", as)
	}
}

func TestLogNeverReturnsPayloads(t *testing.T) {
	const marker = "PAYLOAD-MARKER-7f3a"
	// That the log's statements never name the column is checked beside
	// them (store.TestLogQueriesNeverReadThePayload); this checks what the
	// log returns.
	b := setup(t)
	_, sub := b.endpoint(t, func(*received, int) int { return http.StatusBadRequest })
	b.runDeliverer(t, Config{RetrySchedule: []time.Duration{}})
	id := b.insert(t, sub.ID, "a", 1, `{"secret": "`+marker+`"}`)
	b.waitStatus(t, id, store.StatusDead)
	ctx := t.Context()
	page, err := b.store.List(ctx, store.ListParams{SubscriptionID: sub.ID, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	d, err := b.store.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]any{"list": page, "get": d, "attempts": b.attempts(t, id)} {
		out, _ := json.Marshal(v)
		if strings.Contains(string(out), marker) {
			t.Errorf("%s returned the payload: %s", name, out)
		}
	}
	if len(page.Deliveries) != 1 {
		t.Fatalf("list returned %d deliveries", len(page.Deliveries))
	}
	p, err := b.store.Payload(ctx, id)
	if err != nil || !strings.Contains(string(p), marker) {
		t.Fatalf("Payload (the deliberate way) = %s, %v", p, err)
	}
}

func TestNotifyWakesTheDelivererWithoutPolling(t *testing.T) {
	b := setup(t)
	_, sub := b.endpoint(t, nil)
	// A poll interval of an hour: only NOTIFY bridge_deliveries can wake it.
	b.runDeliverer(t, Config{PollInterval: time.Hour})
	// Let the LISTEN connection come up (Run pokes once when it does).
	testkit.Eventually(t, waitLong, func() string {
		var n int
		_ = b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&n)
		return testkit.Unless(n > 0, "the LISTEN connection")
	})
	// The first may ride on the poke Run gives itself once LISTEN is up; the
	// second arrives when the deliverer is idle, so only NOTIFY can wake it.
	for i := 1; i <= 2; i++ {
		id := b.insert(t, sub.ID, "a", i, `{}`)
		b.waitStatus(t, id, store.StatusDelivered)
	}
}

func TestDelivererReclaimsAStalledClaim(t *testing.T) {
	b := setup(t)
	rc, sub := b.endpoint(t, nil)
	id := b.insert(t, sub.ID, "a", 1, `{}`)
	behind := b.insert(t, sub.ID, "a", 2, `{}`)
	// A worker that claimed it and died: its lease runs out in 50ms.
	if _, err := b.store.Claim(context.Background(), store.ClaimParams{ClaimedBy: "killed", Limit: 1, MaxInFlight: 8, Lease: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	b.runDeliverer(t, Config{ReclaimInterval: 50 * time.Millisecond})
	r := b.waitStatus(t, id, store.StatusDelivered)
	if r.Attempts != 2 {
		t.Fatalf("delivered with %d attempts, want 2 (the stalled attempt is kept)", r.Attempts)
	}
	b.waitStatus(t, behind, store.StatusDelivered)
	if got := rc.requests(); len(got) != 2 || got[0].Env.AssetSeq != 1 || got[1].Env.AssetSeq != 2 {
		t.Fatalf("requests %d, want seq 1 then 2", len(got))
	}
}

func TestShutdownLetsAQuickRequestFinishAndRecordsIt(t *testing.T) {
	b := setup(t)
	arrived := make(chan struct{}, 1)
	proceed := make(chan struct{})
	rc := newReceiver(t, func(*received, int) int {
		arrived <- struct{}{}
		<-proceed
		return http.StatusOK
	})
	t.Cleanup(func() {
		select {
		case <-proceed:
		default:
			close(proceed)
		}
	})
	sub := b.createSub(t, rc.URL)
	_, stop := b.runDeliverer(t, Config{ShutdownGrace: 10 * time.Second})
	id := b.insert(t, sub.ID, "a", 1, `{}`)
	<-arrived
	done := make(chan error, 1)
	go func() { done <- stop() }()
	// Shutdown has begun; the request in flight answers within the grace.
	time.Sleep(50 * time.Millisecond) // let cancellation reach the deliverer before answering
	close(proceed)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r := b.get(t, id); r.Status != store.StatusDelivered || r.Attempts != 1 {
		t.Fatalf("after a graceful shutdown: %+v, want delivered (the request finished within the grace)", r)
	}
}

func TestRetentionDeletesOldDeliveredKeepsDead(t *testing.T) {
	b := setup(t)
	ctx := t.Context()
	s := b.createSub(t, "https://a.example/hook")
	old := b.insert(t, s.ID, "a", 1, `{}`)
	recent := b.insert(t, s.ID, "b", 1, `{}`)
	dead := b.insert(t, s.ID, "c", 1, `{}`)
	if _, err := b.pool.Exec(ctx, `
UPDATE bridge.deliveries SET status = 'delivered', delivered_at = now() - interval '8 days' WHERE id = $1;`, old); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.deliveries SET status = 'delivered', delivered_at = now() WHERE id = $1`, recent); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.deliveries SET status = 'dead', dead_at = now() - interval '30 days' WHERE id = $1`, dead); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO bridge.delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code) VALUES ($1, 1, now(), 1, 200)`, old); err != nil {
		t.Fatal(err)
	}
	b.runDeliverer(t, Config{Retention: 7 * 24 * time.Hour, PruneInterval: 50 * time.Millisecond})
	testkit.Eventually(t, waitLong, func() string {
		_, err := b.store.Get(ctx, old)
		return testkit.Unless(errors.Is(err, store.ErrNotFound), "retention to delete the old delivered row")
	})
	for _, id := range []int64{recent, dead} {
		if _, err := b.store.Get(ctx, id); err != nil {
			t.Fatalf("retention deleted delivery %d: %v", id, err)
		}
	}
	var attempts int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM bridge.delivery_attempts WHERE delivery_id = $1`, old).Scan(&attempts); err != nil || attempts != 0 {
		t.Fatalf("attempts of the deleted delivery: %d (%v)", attempts, err)
	}
}

func TestAttemptLogKeepsTheFirstKiBOfTheAnswer(t *testing.T) {
	b := setup(t)
	big := strings.Repeat("é", 50_000) // 100 KB of two-byte runes: the cut lands mid-rune
	srv := newRawReceiver(t, func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(big))
	})
	sub := b.createSub(t, srv.URL)
	b.runDeliverer(t, Config{RetrySchedule: []time.Duration{}})
	id := b.insert(t, sub.ID, "a", 1, `{}`)
	b.waitStatus(t, id, store.StatusDead)
	as := b.attempts(t, id)
	if len(as) != 1 || len(as[0].ResponseBody) > 1024+3 || !strings.HasPrefix(as[0].ResponseBody, "éé") {
		t.Fatalf("stored %d bytes of the answer, want about 1 KiB", len(as[0].ResponseBody))
	}
}
