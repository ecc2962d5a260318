package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/outbox"
)

// Operational events (contract.Op*) about subscriptions and deliveries. Each
// is enqueued through the public outbox.Enqueue path in the transaction of
// the change it reports: an announcement sent after the commit is lost when
// the process dies between the two, and one sent before announces a change
// that may still roll back. An empty topic (BRIDGE_OPERATIONS_TOPIC=)
// announces nothing and leaves every statement as it was without the
// feature.

// opEvent is one operational event to enqueue.
type opEvent struct {
	asset     string
	eventType string
	payload   any
}

// announce enqueues evs on topic in tx, in order (one subscription's events
// share an asset, so they keep this order end to end).
func announce(ctx context.Context, tx pgx.Tx, topic string, evs ...opEvent) error {
	if topic == "" || len(evs) == 0 {
		return nil
	}
	batch := make([]outbox.Event, len(evs))
	for i, e := range evs {
		batch[i] = outbox.Event{Topic: topic, AssetID: e.asset, EventType: e.eventType, Payload: contract.OperationPayload(e.payload)}
	}
	if _, err := outbox.EnqueueBatch(ctx, tx, batch); err != nil {
		return fmt.Errorf("announce %s: %w", evs[0].eventType, err)
	}
	return nil
}

// announceDeath says whether the death of c is announced as
// bridge.delivery.dead. Never for a delivery of an operational event: a
// subscriber to the operations topic whose endpoint fails would otherwise
// be fed one event per failure about its own failures, each of which fails
// in turn, without end. (The subscription's failing/disabled events are
// still sent: there are at most three warnings and one disable per streak,
// after which nothing is routed to it.)
func announceDeath(c *Claim, opsTopic string) bool {
	return opsTopic != "" && c.Topic != opsTopic && !contract.IsOperation(c.EventType)
}

func deadEvent(c *Claim, cause string, statusCode int, errText string) opEvent {
	return opEvent{
		asset:     contract.OperationsAssetForSubscription(c.SubscriptionID),
		eventType: contract.OpDeliveryDead,
		payload: contract.DeliveryDead{
			SubscriptionID: c.SubscriptionID, DeliveryID: c.ID, EventID: c.EventID, EventType: c.EventType,
			Topic: c.Topic, AssetID: c.AssetID, AssetSeq: c.AssetSeq, Attempts: c.Attempts, Cause: cause,
			StatusCode: statusCode, Error: errText,
		},
	}
}

// deathEvents are what one recorded death announces: the death itself, then
// either the disable it caused or the warning level it reached.
func deathEvents(c *Claim, o Outcome, r DeadResult, disableAfter int, gone bool, opsTopic string, at time.Time) []opEvent {
	var evs []opEvent
	asset := contract.OperationsAssetForSubscription(c.SubscriptionID)
	if announceDeath(c, opsTopic) {
		cause := contract.CauseAttempts
		if gone {
			cause = contract.CauseGone
		}
		evs = append(evs, deadEvent(c, cause, o.StatusCode, o.Error))
	}
	switch {
	case r.DisabledNow:
		cause := contract.CauseFailures
		if gone {
			cause = contract.CauseGone
		}
		evs = append(evs, opEvent{asset: asset, eventType: contract.OpSubscriptionDisabled, payload: contract.SubscriptionDisabled{
			SubscriptionID: c.SubscriptionID, Cause: cause, Reason: r.DisabledReason,
			ConsecutiveFailures: r.ConsecutiveFailures, DisabledAt: at,
		}})
	case r.Enabled:
		if lv := contract.FailingLevel(r.ConsecutiveFailures, disableAfter); lv > contract.FailingLevel(r.ConsecutiveFailures-1, disableAfter) {
			evs = append(evs, opEvent{asset: asset, eventType: contract.OpSubscriptionFailing, payload: contract.SubscriptionFailing{
				SubscriptionID: c.SubscriptionID, Percent: lv, ConsecutiveFailures: r.ConsecutiveFailures,
				DisableAfter: disableAfter, LastError: o.Error,
			}})
		}
	}
	return evs
}
