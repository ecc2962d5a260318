package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/pgtest"
)

type testBundle struct {
	db    *pgtest.DB
	pool  *pgxpool.Pool
	subs  *SubscriptionStore
	store *DeliveryStore
}

// setup is every test's opening: the stores over a database of the test's
// own (pgtest.New), and the test's context, cancelled as the test ends so
// nothing the test started outlives it. It marks the test parallel: no two
// tests share a database, so none can see another's rows.
func setup(t *testing.T) (*testBundle, context.Context) {
	t.Helper()
	t.Parallel()
	return setupB(t), t.Context()
}

func setupB(t testing.TB) *testBundle {
	t.Helper()
	db := pgtest.New(t)
	return &testBundle{
		db:    db,
		pool:  db.Pool,
		subs:  NewSubscriptionStore(db.Pool, true, time.Hour),
		store: NewDeliveryStore(db.Pool),
	}
}

func ptr[T any](v T) *T { return &v }

func (b *testBundle) createSub(t *testing.T, url string) *Subscription {
	t.Helper()
	sub, err := b.subs.Create(context.Background(), SubscriptionInput{URL: &url, EventTypes: []string{"*"}})
	if err != nil {
		t.Fatalf("create subscription: %v", err)
	}
	return sub
}

// insert adds a delivery the way the consumer does and returns its id.
// asset "" means the null asset.
func (b *testBundle) insert(t testing.TB, subID, asset string, n int, payload string) int64 {
	t.Helper()
	var assetArg any
	if asset != "" {
		assetArg = asset
	}
	var id int64
	err := b.pool.QueryRow(context.Background(), `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at, traceparent)
VALUES ($1, $2, 'asset.updated', 'assets', $3, $4, $5::jsonb, now(), $6)
RETURNING id`, subID, fmt.Sprintf("evt-%s-%s-%d-%d", subID[:8], asset, n, time.Now().UnixNano()), assetArg, n, payload,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").Scan(&id)
	if err != nil {
		t.Fatalf("insert delivery: %v", err)
	}
	return id
}

type row struct {
	Status        string
	Attempts      int
	NextAttemptAt time.Time
}

func (b *testBundle) get(t *testing.T, id int64) row {
	t.Helper()
	var r row
	err := b.pool.QueryRow(context.Background(), `SELECT status, attempts, next_attempt_at FROM bridge.deliveries WHERE id = $1`, id).
		Scan(&r.Status, &r.Attempts, &r.NextAttemptAt)
	if err != nil {
		t.Fatalf("read delivery %d: %v", id, err)
	}
	return r
}

func (b *testBundle) sub(t *testing.T, id string) *Subscription {
	t.Helper()
	s, err := b.subs.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("get subscription: %v", err)
	}
	return s
}

// stalledOnLastAttempt inserts a delivery for subID that has used two of its
// attempts and claims it with a 1ms lease: a worker stalled on the last
// attempt, which ReclaimStalled(…, maxAttempts 3) must turn into a death.
func (b *testBundle) stalledOnLastAttempt(t *testing.T, subID string) int64 {
	t.Helper()
	ctx := context.Background()
	id := b.insert(t, subID, "x", 1, `{}`)
	if _, err := b.pool.Exec(ctx, `UPDATE bridge.deliveries SET attempts = 2 WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Claim(ctx, ClaimParams{ClaimedBy: "w", Limit: 1, MaxInFlight: 8, Lease: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	return id
}
