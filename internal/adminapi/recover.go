package adminapi

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/outboxbridge/bridge/internal/audit"
	"github.com/outboxbridge/bridge/internal/delivery/kafkawindow"
	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// recoverRequest is `bridge deliveries recover`'s flags.
type recoverRequest struct {
	SubscriptionID *string `json:"subscription_id"`
	Since          *string `json:"since"`
	Until          *string `json:"until"`
}

type recoverResponse struct {
	Recovered int     `json:"recovered"`
	IDs       []int64 `json:"ids"`
	// With the fast lane on: records of the window read from Kafka, and the
	// events of them queued (those the subscription had no delivery of).
	ReadFromKafka   *int `json:"read_from_kafka,omitempty"`
	QueuedFromKafka *int `json:"queued_from_kafka,omitempty"`
}

// recoverDeliveries revives every dead delivery of a subscription created
// in a window. Every input is checked before anything is written; an
// unknown subscription is a 400 on subscription_id (the window names it as
// input, like since and until), not a 404 of the path.
func (a *adminAPI) recoverDeliveries(w http.ResponseWriter, r *http.Request) error {
	req, err := body[recoverRequest](w, r, false)
	if err != nil {
		return err
	}
	if req.SubscriptionID == nil {
		return badRequest("subscription_id", "is required")
	}
	id, err := store.ParseID(*req.SubscriptionID)
	if err != nil {
		return badRequest("subscription_id", fmt.Sprintf("%q is not a UUID", *req.SubscriptionID))
	}
	var since, until string
	if req.Since != nil {
		since = *req.Since
	}
	if req.Until != nil {
		until = *req.Until
		if until == "" {
			return badRequest("until", `is empty; leave "until" out for a window up to now`)
		}
	}
	win, err := store.ParseWindow(since, until, time.Now())
	if err != nil {
		var we *store.WindowError
		if errors.As(err, &we) {
			return badRequest(we.Field, we.Message)
		}
		return err
	}
	sub, err := a.subs.Get(r.Context(), id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return badRequest("subscription_id", err.Error())
		}
		return err
	}
	if a.kafkaErr != nil {
		return fmt.Errorf("recover reads the window from Kafka (WEBHOOK_FAST_LANE=true), whose client could not be set up: %w", a.kafkaErr)
	}
	rec, err := kafkawindow.RecoverWindow(r.Context(), a.pool, a.deliveries, a.kafkaWindow, sub, win)
	var re *kafkawindow.RetentionError
	if errors.As(err, &re) {
		return badRequest("since", err.Error())
	}
	if err != nil {
		return err
	}
	resp := recoverResponse{Recovered: len(rec.IDs), IDs: rec.IDs}
	changed := int64(len(rec.IDs))
	if rec.Kafka != nil {
		resp.ReadFromKafka, resp.QueuedFromKafka = &rec.Kafka.Read, &rec.Kafka.Queued
		changed += int64(rec.Kafka.Queued)
	}
	a.audit(r, audit.DeliveriesRecover, id, audit.WindowScope(win.Since, win.Until), changed)
	writeJSON(w, http.StatusOK, resp)
	return nil
}
