package store

import (
	"testing"
	"time"
)

// TestInspectViews: health counts per subscription, a stream's open rows in
// order, list filters by event type and time, and the test event.
func TestInspectViews(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSub(t, "https://example.com/hook")
	first := b.insert(t, sub.ID, "a1", 1, `{"x":1}`)
	b.insert(t, sub.ID, "a1", 2, `{"x":2}`)
	b.insert(t, sub.ID, "a1", 3, `{"x":3}`)
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.deliveries SET status = 'dead', dead_at = now() WHERE id = $1`, first); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO bridge.delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code)
		VALUES ($1, 1, now(), 5, 500), ($1, 2, now(), 5, 200)`, first); err != nil {
		t.Fatal(err)
	}
	// The fast lane's attempts of the same subscription count too.
	b.logFastAttempts(t, sub.ID, "fast-1", time.Now().Add(-10*time.Second), 2)
	h, err := b.store.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rates, err := b.store.AttemptRates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := h[sub.ID].WithRates(rates[sub.ID])
	if got.Pending != 2 || got.Dead != 1 || got.AttemptsHour != 4 || got.SucceededHour != 1 || got.DeliveredMinute != 1 || got.SuccessRate() != 0.25 {
		t.Fatalf("health = %+v", got)
	}
	ds, open, err := b.store.Stream(ctx, sub.ID, "a1", 10)
	if err != nil || open != 2 || len(ds) != 2 || ds[0].Seq > ds[1].Seq {
		t.Fatalf("stream = %+v, %d, %v", ds, open, err)
	}
	id, err := b.store.SendTest(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	page, err := b.store.List(ctx, ListParams{SubscriptionID: sub.ID, EventType: TestEventType, Limit: 10})
	if err != nil || len(page.Deliveries) != 1 || page.Deliveries[0].ID != id || page.Deliveries[0].Status != StatusPending {
		t.Fatalf("test delivery listed as %+v, %v", page, err)
	}
	page, err = b.store.List(ctx, ListParams{CreatedFrom: time.Now().Add(time.Hour), Limit: 10})
	if err != nil || len(page.Deliveries) != 0 {
		t.Fatalf("future window listed %+v, %v", page, err)
	}
	page, err = b.store.List(ctx, ListParams{CreatedTo: time.Now().Add(time.Hour), Limit: 10})
	if err != nil || len(page.Deliveries) != 4 {
		t.Fatalf("window listed %d, %v; want 4", len(page.Deliveries), err)
	}
	if _, err := b.store.SendTest(ctx, "7d6f6a38-5b8e-4a53-9a62-5a1c0e0f0f0f"); err == nil {
		t.Fatal("test event to an unknown subscription was queued")
	}
	if tp, err := b.store.Traceparent(ctx, first); err != nil || tp != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Fatalf("traceparent = %q, %v", tp, err)
	}
}
