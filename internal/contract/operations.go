package contract

import (
	"encoding/json"
	"slices"
	"time"
)

// Operational events: state changes an operator or a subscriber should hear
// about, enqueued into bridge.outbox on the operations topic
// (BRIDGE_OPERATIONS_TOPIC) in the same transaction as the change they
// report, so they reach Kafka by the same relay with the same guarantees and
// can be subscribed to like any event (docs/contract.md, "Operational
// events"). A change that rolls back announces nothing; a change that commits
// is never left unannounced.
//
// The event types share the prefix "bridge." so one subscription pattern
// (bridge.*) takes them all.
const (
	OpSubscriptionDisabled      = "bridge.subscription.disabled"
	OpSubscriptionEnabled       = "bridge.subscription.enabled"
	OpSubscriptionFailing       = "bridge.subscription.failing"
	OpSubscriptionSecretRotated = "bridge.subscription.secret_rotated"
	OpDeliveryDead              = "bridge.delivery.dead"
	OpOutboxFailed              = "bridge.outbox.failed"
)

// DefaultOperationsTopic is BRIDGE_OPERATIONS_TOPIC's default.
const DefaultOperationsTopic = "bridge.operations"

// OperationsAssetForSubscription is the asset id of every operational event
// about one subscription (its disables, enables, warnings, secrets and dead
// deliveries): one asset, so a consumer sees them in the order they happened
// ("failing" before "disabled" before "enabled"). The prefix keeps the key
// out of the applications' asset namespace, whose per-asset counter it
// would otherwise share (a gap in an application asset's asset_seq).
func OperationsAssetForSubscription(id string) string { return "bridge.subscription/" + id }

// OperationsAssetForTopic is the asset id of the outbox.failed events of
// the rows of one topic.
func OperationsAssetForTopic(topic string) string { return "bridge.outbox/" + topic }

// FailingPercents are the staged warnings: a subscription that reaches this
// share of WEBHOOK_DISABLE_AFTER consecutive deaths is announced as failing,
// once per level per streak.
var FailingPercents = []int{50, 70, 90}

// FailingLevel is the highest warning level (a FailingPercents entry, or 0)
// that n consecutive deaths reach when disableAfter deaths disable.
func FailingLevel(n, disableAfter int) int {
	level := 0
	if disableAfter < 1 {
		return 0
	}
	for _, p := range FailingPercents {
		if n*100 >= p*disableAfter {
			level = p
		}
	}
	return level
}

// Causes of a disable (SubscriptionDisabled.Cause) and of a death
// (DeliveryDead.Cause).
const (
	CauseGone     = "gone"     // the endpoint answered 410 Gone
	CauseFailures = "failures" // WEBHOOK_DISABLE_AFTER consecutive deaths
	CauseOperator = "operator" // subscriptions disable / the API / the console
	CauseAttempts = "attempts" // the retry schedule ran out
	CauseLease    = "lease"    // the last allowed attempt's lease expired
)

// SubscriptionDisabled is the payload of bridge.subscription.disabled.
type SubscriptionDisabled struct {
	SubscriptionID      string    `json:"subscription_id"`
	Cause               string    `json:"cause"`
	Reason              string    `json:"reason"`
	ConsecutiveFailures int       `json:"consecutive_failures"`
	DisabledAt          time.Time `json:"disabled_at"`
}

// SubscriptionEnabled is the payload of bridge.subscription.enabled (sent
// only when a disabled subscription is enabled again).
type SubscriptionEnabled struct {
	SubscriptionID string    `json:"subscription_id"`
	PreviousReason string    `json:"previous_reason"`
	EnabledAt      time.Time `json:"enabled_at"`
}

// SubscriptionFailing is the payload of bridge.subscription.failing.
type SubscriptionFailing struct {
	SubscriptionID      string `json:"subscription_id"`
	Percent             int    `json:"percent"`
	ConsecutiveFailures int    `json:"consecutive_failures"`
	DisableAfter        int    `json:"disable_after"`
	LastError           string `json:"last_error"`
}

// SubscriptionSecretRotated is the payload of
// bridge.subscription.secret_rotated. It never carries a secret.
type SubscriptionSecretRotated struct {
	SubscriptionID string `json:"subscription_id"`
	// PreviousExpiresAt: until when the rotated-out secret keeps signing
	// (WEBHOOK_SECRET_GRACE).
	PreviousExpiresAt time.Time `json:"previous_expires_at"`
	RotatedAt         time.Time `json:"rotated_at"`
}

// DeliveryDead is the payload of bridge.delivery.dead. Never the event's
// payload: the event id finds it.
type DeliveryDead struct {
	SubscriptionID string  `json:"subscription_id"`
	DeliveryID     int64   `json:"delivery_id"`
	EventID        string  `json:"event_id"`
	EventType      string  `json:"event_type"`
	Topic          string  `json:"topic"`
	AssetID        *string `json:"asset_id"`
	AssetSeq       *int64  `json:"asset_seq"`
	Attempts       int     `json:"attempts"`
	Cause          string  `json:"cause"`
	StatusCode     int     `json:"status_code,omitempty"`
	Error          string  `json:"error"`
}

// OutboxFailed is the payload of bridge.outbox.failed. It is built in SQL,
// in the statement that parks the row (internal/outboxstore); this type is
// its documentation and what tests decode it with.
type OutboxFailed struct {
	ID        string    `json:"id"`
	Topic     string    `json:"topic"`
	AssetID   *string   `json:"asset_id"`
	AssetSeq  int64     `json:"asset_seq"`
	EventType string    `json:"event_type"`
	Attempts  int       `json:"attempts"`
	Error     string    `json:"error"`
	FailedAt  time.Time `json:"failed_at"`
}

// OperationPayload marshals one of the payload types above.
func OperationPayload(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		// The types above hold only strings, numbers and times.
		panic("contract: operational payload: " + err.Error())
	}
	return b
}

// OperationTypes lists the operational event types.
func OperationTypes() []string {
	return []string{OpSubscriptionDisabled, OpSubscriptionEnabled, OpSubscriptionFailing,
		OpSubscriptionSecretRotated, OpDeliveryDead, OpOutboxFailed}
}

// IsOperation reports whether eventType is one of the operational event
// types above. A delivery of one that dies announces nothing (see
// DeliveryDead): a subscriber to the operations topic whose endpoint fails
// would otherwise be fed an event about each of its own failures, which
// fails in turn, without end.
func IsOperation(eventType string) bool {
	return slices.Contains(OperationTypes(), eventType)
}
