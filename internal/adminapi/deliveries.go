package adminapi

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/outboxbridge/bridge/internal/audit"
	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// listDeliveries pages the delivery log newest first (the store's keyset on
// id). ?asset= with an empty value selects the null-asset stream.
func (a *adminAPI) listDeliveries(w http.ResponseWriter, r *http.Request) error {
	q, limit, after, err := pageQuery(r, cursorDeliveries, "subscription", "status", "asset")
	if err != nil {
		return err
	}
	p := store.ListParams{SubscriptionID: q.Get("subscription"), Status: q.Get("status"), Limit: limit, After: after}
	if q.Has("asset") {
		asset := q.Get("asset")
		p.AssetID = &asset
	}
	page, err := a.deliveries.List(r.Context(), p)
	if err != nil {
		var ve *store.ValidationError
		if errors.As(err, &ve) && ve.Field == "subscription id" {
			return badRequest("subscription", fmt.Sprintf("%q is not a UUID", p.SubscriptionID))
		}
		return err
	}
	out := List[store.Delivery]{Items: page.Deliveries}
	if out.Items == nil {
		out.Items = []store.Delivery{}
	}
	if page.NextCursor != "" {
		out.NextCursor = encodeCursor(cursorDeliveries, page.NextCursor)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deliveryID parses a delivery id of the path.
func deliveryID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, badRequest("id", fmt.Sprintf("%q is not a delivery id (a positive integer)", s))
	}
	return id, nil
}

func (a *adminAPI) getDelivery(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r, deliveryID)
	if err != nil {
		return err
	}
	d, err := a.deliveries.Get(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

func (a *adminAPI) deliveryAttempts(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r, deliveryID)
	if err != nil {
		return err
	}
	attempts, err := a.deliveries.Attempts(r.Context(), id)
	if err != nil {
		return err
	}
	if attempts == nil {
		attempts = []store.Attempt{}
	}
	writeJSON(w, http.StatusOK, List[store.Attempt]{Items: attempts})
	return nil
}

type reviveRequest struct {
	IDs            []int64 `json:"ids"`
	SubscriptionID *string `json:"subscription_id"`
	Dead           bool    `json:"dead"`
}

type reviveResponse struct {
	Revived []int64 `json:"revived"`
	// NotRevived lists each id given that was left alone, with the reason
	// (no such delivery, not dead); absent when all were revived and for a
	// subscription's revive.
	NotRevived []store.NotRevived `json:"not_revived,omitempty"`
}

func (a *adminAPI) reviveDeliveries(w http.ResponseWriter, r *http.Request) error {
	req, err := body[reviveRequest](w, r, false)
	if err != nil {
		return err
	}
	bySub := req.SubscriptionID != nil
	switch {
	case bySub && req.IDs != nil:
		return badRequest("ids", `give "ids" or "subscription_id" with "dead": true, not both`)
	case bySub && !req.Dead:
		return badRequest("dead", `"subscription_id" needs "dead": true (revive every dead delivery of the subscription)`)
	case !bySub && req.Dead:
		return badRequest("subscription_id", `"dead" needs "subscription_id"`)
	case !bySub && req.IDs == nil:
		return badRequest("ids", `give "ids" (delivery ids) or "subscription_id" with "dead": true`)
	}
	var revived []int64
	var notRevived []store.NotRevived
	if bySub {
		id, perr := store.ParseID(*req.SubscriptionID)
		if perr != nil {
			return badRequest("subscription_id", fmt.Sprintf("%q is not a UUID", *req.SubscriptionID))
		}
		if _, err := a.subs.Get(r.Context(), id); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return &apiError{Status: http.StatusNotFound, Field: "subscription_id", Message: err.Error()}
			}
			return err
		}
		revived, err = a.deliveries.ReviveSubscription(r.Context(), id)
	} else {
		if len(req.IDs) == 0 {
			return badRequest("ids", "must list at least one delivery id")
		}
		if len(req.IDs) > maxIDs {
			return badRequest("ids", fmt.Sprintf("lists %d ids; at most %d per request", len(req.IDs), maxIDs))
		}
		for i, id := range req.IDs {
			if id < 1 {
				return badRequest(fmt.Sprintf("ids[%d]", i), fmt.Sprintf("%d is not a delivery id (a positive integer)", id))
			}
		}
		revived, notRevived, err = a.deliveries.Revive(r.Context(), req.IDs)
	}
	if err != nil {
		return err
	}
	if bySub {
		a.audit(r, audit.DeliveriesReviveSub, *req.SubscriptionID, "all dead", int64(len(revived)))
	} else {
		target := ""
		if len(req.IDs) == 1 {
			target = strconv.FormatInt(req.IDs[0], 10)
		}
		a.audit(r, audit.DeliveriesRevive, target, fmt.Sprintf("%d ids", len(req.IDs)), int64(len(revived)))
	}
	if revived == nil {
		revived = []int64{}
	}
	writeJSON(w, http.StatusOK, reviveResponse{Revived: revived, NotRevived: notRevived})
	return nil
}
