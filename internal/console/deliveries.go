package console

import (
	"context"
	"net/http"

	"github.com/outboxbridge/bridge/internal/audit"
	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// DeliveryReader is everything the console reads about deliveries. The
// pages read through it alone, so they show a delivery the same whichever
// way it went (the Kafka fast lane or the PostgreSQL slow lane): a delivery
// store that keeps its deliveries or its attempt log elsewhere implements
// these and the console does not change. *store.DeliveryStore implements it.
type DeliveryReader interface {
	// List pages the delivery log newest first (never payloads).
	List(ctx context.Context, p store.ListParams) (*store.Page, error)
	// Get is one delivery; store.ErrNotFound when there is none.
	Get(ctx context.Context, id int64) (*store.Delivery, error)
	// Attempts is a delivery's attempt log, oldest first.
	Attempts(ctx context.Context, id int64) ([]store.Attempt, error)
	// Payload is the one deliberate way to read a payload.
	Payload(ctx context.Context, id int64) ([]byte, error)
	// Traceparent is the W3C traceparent a delivery carries ("" if none).
	Traceparent(ctx context.Context, id int64) (string, error)
	// Stream is the open deliveries of one (subscription, asset) stream.
	Stream(ctx context.Context, subscriptionID, asset string, limit int) ([]store.Delivery, int64, error)
	// ByEvent is one event's deliveries (event id = webhook-id).
	ByEvent(ctx context.Context, eventID string) ([]store.Delivery, error)
	// Health is every subscription's pending, in-flight and dead counts.
	Health(ctx context.Context) (map[string]store.SubscriptionHealth, error)
	// AttemptRates is the last hour's attempt figures per subscription.
	AttemptRates(ctx context.Context) (map[string]store.SubscriptionHealth, error)
	// CountDeadWindow counts what a recover of the window would revive.
	CountDeadWindow(ctx context.Context, subscriptionID string, w store.Window) (int64, error)
}

var _ DeliveryReader = (*store.DeliveryStore)(nil)

// audit writes one console action to the audit log. The action has
// happened: a failure to record it is logged as an error, not answered as
// the action's failure (the operator would retry an action that is done).
func (c *Console) audit(r *http.Request, action, target, scope string, rows int64) {
	e := audit.Entry{Actor: c.actor, Via: audit.ViaConsole, Remote: audit.Remote(r), Action: action, Target: target, Scope: scope, Rows: rows}
	if err := audit.Record(context.WithoutCancel(r.Context()), c.pool, e); err != nil {
		c.log.ErrorContext(r.Context(), "audit log write failed", "action", action, "error", err)
	}
}
