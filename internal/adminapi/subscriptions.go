package adminapi

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outboxbridge/bridge/internal/audit"
	"github.com/outboxbridge/bridge/internal/delivery/kafkawindow"
	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// subscriptionRequest is the body of create (url and event_types required)
// and update (any subset; absent or null leaves a field unchanged, an empty
// topic clears the topic filter).
type subscriptionRequest struct {
	URL         *string  `json:"url"`
	EventTypes  []string `json:"event_types"`
	Topic       *string  `json:"topic"`
	Description *string  `json:"description"`
	// Since (create only): RFC 3339 time or duration ago; the subscription
	// starts with the retained history since then.
	Since *string `json:"since"`
	// RateLimit: requests per second, every deliverer together (0: no
	// limit); RateBurst only with it (absent: the default burst).
	RateLimit *int `json:"rate_limit"`
	RateBurst *int `json:"rate_burst"`
}

func (req subscriptionRequest) input() (store.SubscriptionInput, error) {
	for _, f := range []struct {
		name  string
		value *string
	}{{"url", req.URL}, {"topic", req.Topic}, {"description", req.Description}} {
		if f.value != nil {
			if err := checkText(f.name, *f.value); err != nil {
				return store.SubscriptionInput{}, err
			}
		}
	}
	for _, t := range req.EventTypes {
		if err := checkText("event_types", t); err != nil {
			return store.SubscriptionInput{}, err
		}
	}
	in := store.SubscriptionInput{URL: req.URL, EventTypes: req.EventTypes, Topic: req.Topic, Description: req.Description,
		RateLimit: req.RateLimit, RateBurst: req.RateBurst}
	if req.Since != nil {
		t, err := store.ParseSince(*req.Since, time.Now())
		if err != nil {
			return store.SubscriptionInput{}, err
		}
		in.Since = &t
	}
	return in, nil
}

// withoutSecret is the only shape a subscription leaves the API in, except
// the answers to create and rotate-secret.
func withoutSecret(s *store.Subscription) *store.Subscription {
	s.Secret = ""
	return s
}

// listSubscriptions pages the subscriptions oldest first. The store reads
// them all (there is one per endpoint: tens to thousands, not millions) and
// the page is cut here; the cursor is the (created_at, id) of the last row
// shown, the store's own order, so rows created or deleted between two
// requests neither repeat nor hide the others.
func (a *adminAPI) listSubscriptions(w http.ResponseWriter, r *http.Request) error {
	_, limit, pos, err := pageQuery(r, cursorSubscriptions)
	if err != nil {
		return err
	}
	var afterAt time.Time
	var afterID string
	if pos != "" {
		nanos, id, ok := strings.Cut(pos, "/")
		n, perr := strconv.ParseInt(nanos, 10, 64)
		if _, iderr := store.ParseID(id); !ok || perr != nil || iderr != nil {
			return badRequest("cursor", "is not a next_cursor returned by this list")
		}
		afterAt, afterID = time.Unix(0, n), id
	}
	subs, err := a.subs.List(r.Context())
	if err != nil {
		return err
	}
	start := 0
	if pos != "" {
		for start < len(subs) && !after(subs[start], afterAt, afterID) {
			start++
		}
	}
	page := List[store.Subscription]{Items: []store.Subscription{}}
	for i := start; i < len(subs) && len(page.Items) < limit; i++ {
		page.Items = append(page.Items, *withoutSecret(&subs[i]))
	}
	if start+limit < len(subs) {
		last := page.Items[len(page.Items)-1]
		page.NextCursor = encodeCursor(cursorSubscriptions, strconv.FormatInt(last.CreatedAt.UnixNano(), 10)+"/"+last.ID)
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// after reports whether s sorts after (at, id) in the store's order
// (created_at, id); uuid order in PostgreSQL is the order of their
// lowercase text.
func after(s store.Subscription, at time.Time, id string) bool {
	if !s.CreatedAt.Equal(at) {
		return s.CreatedAt.After(at)
	}
	return s.ID > id
}

func (a *adminAPI) createSubscription(w http.ResponseWriter, r *http.Request) error {
	req, err := body[subscriptionRequest](w, r, false)
	if err != nil {
		return err
	}
	in, err := req.input()
	if err != nil {
		return err
	}
	if in.EventTypes == nil {
		return badRequest("event_types", "is required: exact names, prefix.* wildcards or *")
	}
	if err := a.checkHistory(r.Context(), in); err != nil {
		return err
	}
	sub, err := a.subs.Create(r.Context(), in)
	if err != nil {
		return err
	}
	a.audit(r, audit.SubscriptionCreate, sub.ID, "", 1)
	w.Header().Set("Location", "/api/v1/subscriptions/"+sub.ID)
	writeJSON(w, http.StatusCreated, sub)
	return nil
}

func (a *adminAPI) getSubscription(w http.ResponseWriter, r *http.Request) error {
	if _, err := query(r); err != nil {
		return err
	}
	sub, err := a.subs.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, withoutSecret(sub))
	return nil
}

func (a *adminAPI) updateSubscription(w http.ResponseWriter, r *http.Request) error {
	id, req, err := subscriptionAndBody[subscriptionRequest](w, r, false)
	if err != nil {
		return err
	}
	in, err := req.input()
	if err != nil {
		return err
	}
	if in.URL == nil && in.EventTypes == nil && in.Topic == nil && in.Description == nil && in.Since == nil &&
		in.RateLimit == nil && in.RateBurst == nil {
		return badRequest("body", "nothing to update: give at least one of url, event_types, topic, description, rate_limit")
	}
	sub, err := a.subs.Update(r.Context(), id, in)
	if err != nil {
		return err
	}
	a.audit(r, audit.SubscriptionUpdate, sub.ID, "", 1)
	writeJSON(w, http.StatusOK, withoutSecret(sub))
	return nil
}

func (a *adminAPI) deleteSubscription(w http.ResponseWriter, r *http.Request) error {
	if _, err := query(r); err != nil {
		return err
	}
	if err := a.subs.Delete(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	a.audit(r, audit.SubscriptionDelete, r.PathValue("id"), "", 1)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// rotateSecret answers with the new secret: the one time it is shown.
func (a *adminAPI) rotateSecret(w http.ResponseWriter, r *http.Request) error {
	return a.subscriptionAction(w, r, audit.SubscriptionRotate, a.subs.RotateSecret, func(s *store.Subscription) *store.Subscription { return s })
}

func (a *adminAPI) enableSubscription(w http.ResponseWriter, r *http.Request) error {
	return a.subscriptionAction(w, r, audit.SubscriptionEnable, a.subs.Enable, withoutSecret)
}

// subscriptionAndBody starts a handler that changes the path's subscription
// as its JSON body says: the id is checked before the body is read.
func subscriptionAndBody[T any](w http.ResponseWriter, r *http.Request, optional bool) (string, T, error) {
	id, err := pathID(r, store.ParseID)
	if err != nil {
		var zero T
		return "", zero, err
	}
	req, err := body[T](w, r, optional)
	return id, req, err
}

// subscriptionAction is POST /subscriptions/{id}/<action> for an action that
// takes no input: act on the path's subscription, answer it as show gives it.
func (a *adminAPI) subscriptionAction(w http.ResponseWriter, r *http.Request, action string, act func(ctx context.Context, id string) (*store.Subscription, error),
	show func(*store.Subscription) *store.Subscription) error {
	if err := noInput(w, r); err != nil {
		return err
	}
	sub, err := act(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	a.audit(r, action, sub.ID, "", 1)
	writeJSON(w, http.StatusOK, show(sub))
	return nil
}

type disableRequest struct {
	Reason *string `json:"reason"`
}

func (a *adminAPI) disableSubscription(w http.ResponseWriter, r *http.Request) error {
	id, req, err := subscriptionAndBody[disableRequest](w, r, true)
	if err != nil {
		return err
	}
	var reason string
	if req.Reason != nil {
		if err := checkText("reason", *req.Reason); err != nil {
			return err
		}
		reason = *req.Reason
	}
	sub, err := a.subs.Disable(r.Context(), id, reason)
	if err != nil {
		return err
	}
	a.audit(r, audit.SubscriptionDisable, sub.ID, "", 1)
	writeJSON(w, http.StatusOK, withoutSecret(sub))
	return nil
}

// noInput checks a request that takes neither query nor body: an empty body
// or {} is accepted, anything else is a field the endpoint does not know.
func noInput(w http.ResponseWriter, r *http.Request) error {
	_, err := body[struct{}](w, r, true)
	return err
}

// checkHistory refuses, with the fast lane on, a history (since) that
// reaches past what the topics still hold: the copy reads them by time.
func (a *adminAPI) checkHistory(ctx context.Context, in store.SubscriptionInput) error {
	if in.Since == nil || a.kafkaWindow == nil {
		return nil
	}
	topic := ""
	if in.Topic != nil {
		topic = *in.Topic
	}
	err := a.kafkaWindow.CheckSince(ctx, topic, *in.Since)
	var re *kafkawindow.RetentionError
	if errors.As(err, &re) {
		return badRequest("since", err.Error())
	}
	return err
}
