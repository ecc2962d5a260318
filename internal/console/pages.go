package console

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/audit"
	"github.com/outboxbridge/bridge/internal/database/statement"
	"github.com/outboxbridge/bridge/internal/delivery/kafkawindow"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/jaegerquery"
	"github.com/outboxbridge/bridge/internal/outboxstore"
)

// pageSize is the rows per list page.
const pageSize = 50

// maxSelected bounds one "replay/revive selected" form (the admin API's
// per-request bound).
const maxSelected = 10000

// Overview -------------------------------------------------------------------

func (c *Console) overviewData(r *http.Request) map[string]any {
	snap, hist := c.sampler.latest(r.Context())
	var failed int64
	for _, t := range snap.Topics {
		failed += t.Failed
	}
	return map[string]any{
		"S":          snap,
		"Every":      c.cfg.SampleEvery,
		"Failed":     failed,
		"Throughput": newChart("sent per second", hist, series(hist, func(s Snapshot) float64 { return s.Throughput.PerSecond() }), rateFormat),
		"Latency":    newChart("p95 commit → ack", hist, series(hist, func(s Snapshot) float64 { return s.Throughput.LatencyP95 }), secondsFormat),
		"LagChart":   newChart("consumer lag", hist, series(hist, func(s Snapshot) float64 { return float64(s.LagTotal) }), countFormat),
		"PendChart":  newChart("pending deliveries", hist, series(hist, func(s Snapshot) float64 { return float64(s.Pending) }), countFormat),
		"DelivChart": newChart("delivered per second", hist, series(hist, func(s Snapshot) float64 { return s.Delivered }), rateFormat),
		"DeadChart":  newChart("dead deliveries", hist, series(hist, func(s Snapshot) float64 { return float64(s.Dead) }), countFormat),
		"FailChart": newChart("FAILED outbox rows", hist, series(hist, func(s Snapshot) float64 {
			var n int64
			for _, t := range s.Topics {
				n += t.Failed
			}
			return float64(n)
		}), countFormat),
		"Samples":  len(hist),
		"Since":    hist[0].At,
		"HasKafka": c.kafka != nil,
	}
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) error {
	c.render(w, r, http.StatusOK, "overview", "Overview", c.overviewData(r))
	return nil
}

func (c *Console) overviewLive(w http.ResponseWriter, r *http.Request) error {
	r.Header.Set("HX-Request", "true")
	c.render(w, r, http.StatusOK, "overview", "Overview", c.overviewData(r))
	return nil
}

// Outbox ---------------------------------------------------------------------

// timeLayout is what <input type="datetime-local"> submits; the console
// reads it as UTC, and says so next to the field.
const timeLayout = "2006-01-02T15:04"

func parseTime(field, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	for _, l := range []string{timeLayout, timeLayout + ":05", time.RFC3339} {
		if t, err := time.ParseInLocation(l, v, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%s %q is not a time (YYYY-MM-DDTHH:MM, UTC)", field, v)
}

func failedFilter(q url.Values) (outboxstore.FailedFilter, error) {
	f := outboxstore.FailedFilter{
		Topic:         strings.TrimSpace(q.Get("topic")),
		AssetID:       strings.TrimSpace(q.Get("asset")),
		EventType:     strings.TrimSpace(q.Get("event_type")),
		ErrorContains: strings.TrimSpace(q.Get("error")),
	}
	var err error
	if f.FailedFrom, err = parseTime("from", q.Get("from")); err != nil {
		return f, err
	}
	if f.FailedTo, err = parseTime("to", q.Get("to")); err != nil {
		return f, err
	}
	return f, nil
}

// filterValues are the filter fields of q (for links that keep them).
func filterValues(q url.Values, keys ...string) url.Values {
	out := url.Values{}
	for _, k := range keys {
		if v := q.Get(k); v != "" {
			out.Set(k, v)
		}
	}
	return out
}

var failedKeys = []string{"topic", "asset", "event_type", "error", "from", "to"}

// outboxStatuses are the outbox views, in the order of their tabs.
var outboxStatuses = []string{"FAILED", "NEW", "SENT"}

// viewCap bounds the count of a NEW or SENT view ("10,000+").
const viewCap = 10000

func (c *Console) outboxList(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	status := cmp.Or(strings.ToUpper(strings.TrimSpace(q.Get("status"))), "FAILED")
	if status != "FAILED" {
		return c.outboxView(w, r, status)
	}
	f, err := failedFilter(q)
	if err != nil {
		return errorStatus(http.StatusBadRequest, err.Error())
	}
	var after int64
	if a := q.Get("after"); a != "" {
		if after, err = strconv.ParseInt(a, 10, 64); err != nil || after < 0 {
			return errorStatus(http.StatusBadRequest, "after is not a position from a previous page")
		}
	}
	rows, err := outboxstore.ListFailedMatching(r.Context(), c.pool, f, pageSize+1, after)
	if err != nil {
		return err
	}
	total, err := outboxstore.CountFailedMatching(r.Context(), c.pool, f)
	if err != nil {
		return err
	}
	var next string
	if len(rows) > pageSize {
		rows = rows[:pageSize]
		next = strconv.FormatInt(rows[pageSize-1].Seq, 10)
	}
	c.render(w, r, http.StatusOK, "outbox", "Outbox", map[string]any{
		"Rows": rows, "Total": total, "Next": next, "Q": filterValues(q, failedKeys...), "Filtered": f != (outboxstore.FailedFilter{}),
		"F":      map[string]string{"topic": q.Get("topic"), "asset": q.Get("asset"), "event_type": q.Get("event_type"), "error": q.Get("error"), "from": q.Get("from"), "to": q.Get("to")},
		"After":  after > 0,
		"Status": "FAILED", "Statuses": outboxStatuses,
	})
	return nil
}

var viewKeys = []string{"status", "topic", "asset", "event_type"}

// outboxView is the NEW or SENT view: rows with their age, paged.
func (c *Console) outboxView(w http.ResponseWriter, r *http.Request, status string) error {
	q := r.URL.Query()
	if !slices.Contains(outboxStatuses, status) {
		return errorStatus(http.StatusBadRequest, fmt.Sprintf("status %q: the outbox views are FAILED, NEW and SENT", q.Get("status")))
	}
	f := outboxstore.ViewFilter{Topic: strings.TrimSpace(q.Get("topic")), AssetID: strings.TrimSpace(q.Get("asset")), EventType: strings.TrimSpace(q.Get("event_type"))}
	p, err := outboxstore.ListView(r.Context(), c.pool, status, f, pageSize, q.Get("after"))
	if errors.Is(err, outboxstore.ErrBadCursor) {
		return errorStatus(http.StatusBadRequest, "after: "+err.Error())
	}
	if err != nil {
		return err
	}
	total, err := outboxstore.CountView(r.Context(), c.pool, status, f, viewCap)
	if err != nil {
		return err
	}
	c.render(w, r, http.StatusOK, "outbox_view", "Outbox", map[string]any{
		"Rows": p.Rows, "Next": p.Next, "Total": total, "More": total >= viewCap, "Q": filterValues(q, viewKeys...),
		"F":     map[string]string{"topic": q.Get("topic"), "asset": q.Get("asset"), "event_type": q.Get("event_type")},
		"After": q.Get("after") != "", "Filtered": f != (outboxstore.ViewFilter{}),
		"Status": status, "Statuses": outboxStatuses, "Now": time.Now(),
	})
	return nil
}

// outboxReplayConfirm asks before replaying every row matching the filter,
// with the count.
func (c *Console) outboxReplayConfirm(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	f, err := failedFilter(q)
	if err != nil {
		return errorStatus(http.StatusBadRequest, err.Error())
	}
	n, err := outboxstore.CountFailedMatching(r.Context(), c.pool, f)
	if err != nil {
		return err
	}
	c.render(w, r, http.StatusOK, "outbox_confirm", "Replay", map[string]any{
		"All": true, "Count": n, "Q": filterValues(q, failedKeys...), "F": q,
	})
	return nil
}

func parseRowIDs(vals []string) ([]uuid.UUID, error) {
	if len(vals) > maxSelected {
		return nil, fmt.Errorf("%d rows selected; at most %d at once", len(vals), maxSelected)
	}
	out := make([]uuid.UUID, 0, len(vals))
	for _, v := range vals {
		id, err := uuid.Parse(v)
		if err != nil {
			return nil, fmt.Errorf("%q is not an outbox row id", v)
		}
		out = append(out, id)
	}
	return out, nil
}

// outboxReplay replays the selected rows (id=…, after a confirmation page
// naming how many) or all that match the filter (all=1, confirmed).
func (c *Console) outboxReplay(w http.ResponseWriter, r *http.Request) error {
	s := sessionFrom(r.Context())
	confirmed := r.PostFormValue("confirmed") == "1"
	if r.PostFormValue("all") == "1" {
		f, err := failedFilter(r.PostForm)
		if err != nil {
			return errorStatus(http.StatusBadRequest, err.Error())
		}
		if !confirmed {
			http.Redirect(w, r, link("/ui/outbox/replay", filterValues(r.PostForm, failedKeys...)), http.StatusSeeOther)
			return nil
		}
		n, err := outboxstore.ReplayFailedMatching(r.Context(), c.pool, f)
		if err != nil {
			return err
		}
		c.audit(r, audit.OutboxReplayMatching, "", cmp.Or(scopeOf(filterValues(r.PostForm, failedKeys...)), "all FAILED"), n)
		c.setFlash(s, fmt.Sprintf("Replayed %s: they are NEW again and the relay sends them in their original order.", plural(n, "FAILED row", "FAILED rows")))
		http.Redirect(w, r, link("/ui/outbox", filterValues(r.PostForm, failedKeys...)), http.StatusSeeOther)
		return nil
	}
	ids, err := parseRowIDs(r.PostForm["id"])
	if err != nil {
		return errorStatus(http.StatusBadRequest, err.Error())
	}
	if len(ids) == 0 {
		return errorStatus(http.StatusBadRequest, "No rows selected: tick the rows to replay, or use “Replay all that match”.")
	}
	if !confirmed {
		c.render(w, r, http.StatusOK, "outbox_confirm", "Replay", map[string]any{"IDs": r.PostForm["id"], "Count": len(ids), "Back": r.PostFormValue("back")})
		return nil
	}
	replayed, skipped, err := outboxstore.ReplayIDs(r.Context(), c.pool, ids)
	if err != nil {
		return err
	}
	c.audit(r, audit.OutboxReplayIDs, oneTarget(ids), plural(len(ids), "id", "ids"), int64(len(replayed)))
	return selectionDone(c, w, r, s, "Replayed", "row", "rows", len(replayed), len(ids), skipped,
		"/ui/outbox/"+ids[0].String(), "/ui/outbox")
}

func (c *Console) outboxRowOf(w http.ResponseWriter, r *http.Request, withPayload bool) *outboxstore.Row {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		c.errorPage(w, r, http.StatusBadRequest, fmt.Sprintf("%q is not an outbox row id", r.PathValue("id")))
		return nil
	}
	row, err := outboxstore.GetRow(r.Context(), c.pool, id, withPayload)
	if errors.Is(err, pgx.ErrNoRows) {
		c.errorPage(w, r, http.StatusNotFound, "No outbox row "+id.String()+" (SENT rows are deleted after RELAY_RETENTION).")
		return nil
	}
	if err != nil {
		c.fail(w, r, err)
		return nil
	}
	return row
}

func (c *Console) outboxRow(w http.ResponseWriter, r *http.Request) error {
	withPayload := r.URL.Query().Get("payload") == "1"
	row := c.outboxRowOf(w, r, withPayload)
	if row == nil {
		return nil
	}
	c.render(w, r, http.StatusOK, "outbox_row", "Outbox row", map[string]any{"Row": row, "ShowPayload": withPayload, "TraceID": row.TraceID()})
	return nil
}

// outboxRowStatus is the detail page's live status (htmx polls it).
func (c *Console) outboxRowStatus(w http.ResponseWriter, r *http.Request) error {
	row := c.outboxRowOf(w, r, false)
	if row == nil {
		return nil
	}
	r.Header.Set("HX-Request", "true")
	c.render(w, r, http.StatusOK, "outbox_row", "Outbox row", map[string]any{"Row": row})
	return nil
}

// Subscriptions ---------------------------------------------------------------

func (c *Console) subscriptionList(w http.ResponseWriter, r *http.Request) error {
	subs, err := c.subs.List(r.Context())
	if err != nil {
		return err
	}
	health, err := c.health(r.Context())
	if err != nil {
		return err
	}
	rows := make([]subRow, 0, len(subs))
	for _, s := range subs {
		s.Secret = ""
		rows = append(rows, subRow{Sub: s, Health: health[s.ID]})
	}
	c.render(w, r, http.StatusOK, "subscriptions", "Subscriptions", map[string]any{"Subs": rows, "RatesAt": c.sampler.ratesRead()})
	return nil
}

// splitTypes reads an event-types field: comma- or space-separated.
func splitTypes(v string) []string {
	var out []string
	for _, t := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r' }) {
		out = append(out, t)
	}
	return out
}

func formInput(r *http.Request) store.SubscriptionInput {
	u := strings.TrimSpace(r.PostFormValue("url"))
	types := splitTypes(r.PostFormValue("event_types"))
	topic := strings.TrimSpace(r.PostFormValue("topic"))
	desc := strings.TrimSpace(r.PostFormValue("description"))
	in := store.SubscriptionInput{URL: &u, Topic: &topic, Description: &desc, EventTypes: types}
	if in.EventTypes == nil {
		in.EventTypes = []string{}
	}
	return in
}

func (c *Console) subscriptionCreate(w http.ResponseWriter, r *http.Request) error {
	in := formInput(r)
	if v := strings.TrimSpace(r.PostFormValue("since")); v != "" {
		t, err := store.ParseSince(v, time.Now())
		if err != nil {
			return err
		}
		in.Since = &t
	}
	sub, err := c.subs.Create(r.Context(), in)
	if err != nil {
		return err
	}
	c.audit(r, audit.SubscriptionCreate, sub.ID, "", 1)
	// Post/Redirect/Get: the secret goes to its page through the session,
	// never in a URL or a flash message, and is shown once; reloading that
	// page creates nothing and shows no secret.
	c.handOff(sessionFrom(r.Context()), sub, true)
	http.Redirect(w, r, "/ui/subscriptions/"+sub.ID+"/secret", http.StatusSeeOther)
	return nil
}

// subscriptionSecret shows a created or rotated secret, once.
func (c *Console) subscriptionSecret(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	h := c.takeHandoff(sessionFrom(r.Context()), id)
	if h == nil {
		sub, err := c.subs.Get(r.Context(), id)
		if err != nil {
			return err
		}
		sub.Secret = ""
		c.render(w, r, http.StatusGone, "subscription_secret", "Secret", map[string]any{"Sub": sub, "Gone": true})
		return nil
	}
	title := "Secret rotated"
	if h.created {
		title = "Subscription created"
	}
	c.render(w, r, http.StatusOK, "subscription_secret", title, map[string]any{"Sub": h.sub, "Created": h.created, "Grace": c.cfg.SecretGrace})
	return nil
}

func (c *Console) subscriptionPage(w http.ResponseWriter, r *http.Request) error {
	sub, err := c.subs.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	sub.Secret = ""
	health, err := c.health(r.Context())
	if err != nil {
		return err
	}
	c.render(w, r, http.StatusOK, "subscription", "Subscription", map[string]any{
		"Sub": sub, "Health": health[sub.ID], "Types": strings.Join(sub.EventTypes, ", "), "Grace": c.cfg.SecretGrace,
		"RatesAt": c.sampler.ratesRead(), "Charts": c.subscriptionCharts(r, sub.ID),
	})
	return nil
}

func (c *Console) subscriptionEdit(w http.ResponseWriter, r *http.Request) error {
	if _, err := c.subs.Update(r.Context(), r.PathValue("id"), formInput(r)); err != nil {
		return err
	}
	c.audit(r, audit.SubscriptionUpdate, r.PathValue("id"), "", 1)
	c.setFlash(sessionFrom(r.Context()), "Saved.")
	http.Redirect(w, r, "/ui/subscriptions/"+r.PathValue("id"), http.StatusSeeOther)
	return nil
}

func (c *Console) subscriptionRotate(w http.ResponseWriter, r *http.Request) error {
	sub, err := c.subs.RotateSecret(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	c.audit(r, audit.SubscriptionRotate, sub.ID, "", 1)
	c.handOff(sessionFrom(r.Context()), sub, false)
	http.Redirect(w, r, "/ui/subscriptions/"+sub.ID+"/secret", http.StatusSeeOther)
	return nil
}

func (c *Console) subscriptionEnable(w http.ResponseWriter, r *http.Request) error {
	if _, err := c.subs.Enable(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	c.audit(r, audit.SubscriptionEnable, r.PathValue("id"), "", 1)
	c.setFlash(sessionFrom(r.Context()), "Enabled: deliveries resume, the failure count is back to 0.")
	http.Redirect(w, r, "/ui/subscriptions/"+r.PathValue("id"), http.StatusSeeOther)
	return nil
}

func (c *Console) subscriptionDisable(w http.ResponseWriter, r *http.Request) error {
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if _, err := c.subs.Disable(r.Context(), r.PathValue("id"), reason); err != nil {
		return err
	}
	c.audit(r, audit.SubscriptionDisable, r.PathValue("id"), "", 1)
	c.setFlash(sessionFrom(r.Context()), "Disabled: queued deliveries wait, new events are not queued for it.")
	http.Redirect(w, r, "/ui/subscriptions/"+r.PathValue("id"), http.StatusSeeOther)
	return nil
}

func (c *Console) subscriptionDelete(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	sub, err := c.subs.Get(r.Context(), id)
	if err != nil {
		return err
	}
	if strings.TrimSpace(r.PostFormValue("confirm")) != sub.ID[:8] {
		return errorStatus(http.StatusBadRequest, "Not deleted: type the first 8 characters of the subscription id ("+sub.ID[:8]+") to confirm.")
	}
	if err := c.subs.Delete(r.Context(), id); err != nil {
		return err
	}
	c.audit(r, audit.SubscriptionDelete, sub.ID, "", 1)
	c.setFlash(sessionFrom(r.Context()), "Deleted subscription "+sub.ID+" ("+sub.URL+") with its deliveries and log.")
	http.Redirect(w, r, "/ui/subscriptions", http.StatusSeeOther)
	return nil
}

func (c *Console) subscriptionTest(w http.ResponseWriter, r *http.Request) error {
	did, err := c.actions.SendTest(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	c.audit(r, audit.SubscriptionTest, r.PathValue("id"), "delivery "+strconv.FormatInt(did, 10), 1)
	c.setFlash(sessionFrom(r.Context()), fmt.Sprintf("Test event queued as delivery %d (event type %s).", did, store.TestEventType))
	http.Redirect(w, r, "/ui/deliveries/"+strconv.FormatInt(did, 10), http.StatusSeeOther)
	return nil
}

// Deliveries -----------------------------------------------------------------

var deliveryKeys = []string{"subscription", "status", "asset", "event_type", "from", "to"}

func (c *Console) deliveryList(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p := store.ListParams{SubscriptionID: q.Get("subscription"), Status: q.Get("status"), EventType: strings.TrimSpace(q.Get("event_type")),
		Limit: pageSize, After: q.Get("after")}
	if q.Has("asset") && q.Get("asset") != "" {
		a := strings.TrimSpace(q.Get("asset"))
		p.AssetID = &a
	}
	var err error
	if p.CreatedFrom, err = parseTime("from", q.Get("from")); err == nil {
		p.CreatedTo, err = parseTime("to", q.Get("to"))
	}
	if err != nil {
		return errorStatus(http.StatusBadRequest, err.Error())
	}
	page, err := c.deliveries.List(r.Context(), p)
	if err != nil {
		return err
	}
	subs, err := c.subs.List(r.Context())
	if err != nil {
		return err
	}
	urls := map[string]string{}
	for _, s := range subs {
		urls[s.ID] = s.URL
	}
	data := map[string]any{
		"Page": page, "Subs": subs, "URLs": urls, "Q": filterValues(q, deliveryKeys...), "After": p.After != "",
		"F":        map[string]string{"subscription": q.Get("subscription"), "status": q.Get("status"), "asset": q.Get("asset"), "event_type": q.Get("event_type"), "from": q.Get("from"), "to": q.Get("to")},
		"Statuses": []string{store.StatusPending, store.StatusDelivering, store.StatusDelivered, store.StatusDead},
	}
	// "Revive all that match" is offered only for a filter the revive
	// statements express exactly: one subscription's dead deliveries,
	// optionally created in a window. With an asset or an event type in
	// the filter it would revive more than the list shows, so it is not
	// offered.
	if p.SubscriptionID != "" && p.Status == store.StatusDead {
		if p.AssetID != nil || p.EventType != "" {
			data["ReviveNote"] = "To revive every dead delivery that matches, filter by subscription and creation time only (asset and event type narrow the list, not the revive)."
		} else {
			rq := url.Values{"subscription": {p.SubscriptionID}}
			if !p.CreatedFrom.IsZero() {
				rq.Set("since", p.CreatedFrom.UTC().Format(time.RFC3339))
				if !p.CreatedTo.IsZero() {
					rq.Set("until", p.CreatedTo.UTC().Format(time.RFC3339))
				}
				data["ReviveMatching"] = href("/ui/deliveries/recover", rq)
			} else if !p.CreatedTo.IsZero() {
				data["ReviveNote"] = "To revive the dead deliveries created before a time, give the window's start (Created from) too."
			} else {
				data["ReviveMatching"] = href("/ui/deliveries/revive", rq)
			}
		}
	}
	c.render(w, r, http.StatusOK, "deliveries", "Deliveries", data)
	return nil
}

func (c *Console) deliveryPage(w http.ResponseWriter, r *http.Request) error {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		return errorStatus(http.StatusBadRequest, fmt.Sprintf("%q is not a delivery id", r.PathValue("id")))
	}
	d, err := c.deliveries.Get(r.Context(), id)
	if err != nil {
		return err
	}
	attempts, err := c.deliveries.AttemptLog(r.Context(), store.AttemptLogParams{DeliveryID: id, Limit: attemptPageSize})
	if err != nil {
		return err
	}
	tp, err := c.deliveries.Traceparent(r.Context(), id)
	if err != nil {
		return err
	}
	data := map[string]any{"D": d, "Attempts": attempts.Attempts, "TraceID": jaegerquery.TraceIDOf(tp),
		"Live": d.Status == store.StatusPending || d.Status == store.StatusDelivering}
	if r.URL.Query().Get("payload") == "1" {
		p, err := c.deliveries.Payload(r.Context(), id)
		if err != nil {
			return err
		}
		data["Payload"] = string(p)
	}
	if sub, err := c.subs.Get(r.Context(), d.SubscriptionID); err == nil {
		data["URL"] = sub.URL
	}
	if attempts.NextCursor != "" {
		data["MoreAttempts"] = href("/ui/attempts", nil, "subscription", d.SubscriptionID, "event", d.EventID, "cursor", attempts.NextCursor)
	}
	c.render(w, r, http.StatusOK, "delivery", "Delivery", data)
	return nil
}

// attemptPageSize is the attempts per page of the console's attempt lists.
const attemptPageSize = 100

// attemptsPage is the attempt log of (subscription, event id), either lane,
// oldest first, a page at a time: how to see the attempts of a delivery the
// fast lane made without a delivery row.
func (c *Console) attemptsPage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p := store.AttemptLogParams{SubscriptionID: q.Get("subscription"), EventID: q.Get("event"), Limit: attemptPageSize, After: q.Get("cursor")}
	if p.SubscriptionID == "" || p.EventID == "" {
		return errorStatus(http.StatusBadRequest, "subscription and event: both are required (a subscription id and an event id, the webhook-id)")
	}
	page, err := c.deliveries.AttemptLog(r.Context(), p)
	if err != nil {
		return err
	}
	data := map[string]any{"Sub": p.SubscriptionID, "Event": p.EventID, "Attempts": page.Attempts}
	if page.NextCursor != "" {
		data["Next"] = href("/ui/attempts", nil, "subscription", p.SubscriptionID, "event", p.EventID, "cursor", page.NextCursor)
	}
	c.render(w, r, http.StatusOK, "attempts", "Attempts", data)
	return nil
}

// reviveConfirm asks before reviving every dead delivery of a subscription,
// with the count.
func (c *Console) reviveConfirm(w http.ResponseWriter, r *http.Request) error {
	sub, err := c.subs.Get(r.Context(), r.URL.Query().Get("subscription"))
	if err != nil {
		return err
	}
	health, err := c.health(r.Context())
	if err != nil {
		return err
	}
	c.render(w, r, http.StatusOK, "revive", "Revive", map[string]any{"Sub": sub, "Count": health[sub.ID].Dead})
	return nil
}

func (c *Console) revive(w http.ResponseWriter, r *http.Request) error {
	s := sessionFrom(r.Context())
	confirmed := r.PostFormValue("confirmed") == "1"
	if subID := r.PostFormValue("subscription"); subID != "" {
		if !confirmed {
			http.Redirect(w, r, link("/ui/deliveries/revive", url.Values{"subscription": {subID}}), http.StatusSeeOther)
			return nil
		}
		if _, err := c.subs.Get(r.Context(), subID); err != nil {
			return err
		}
		revived, err := c.actions.ReviveSubscription(r.Context(), subID)
		if err != nil {
			return err
		}
		c.audit(r, audit.DeliveriesReviveSub, subID, "all dead", int64(len(revived)))
		c.setFlash(s, fmt.Sprintf("Revived %s: pending again, with a fresh retry budget, in their original order.", plural(len(revived), "dead delivery", "dead deliveries")))
		http.Redirect(w, r, link("/ui/deliveries", url.Values{"subscription": {subID}}), http.StatusSeeOther)
		return nil
	}
	vals := r.PostForm["id"]
	if len(vals) == 0 {
		return errorStatus(http.StatusBadRequest, "No deliveries selected: tick the dead deliveries to revive.")
	}
	if len(vals) > maxSelected {
		return errorStatus(http.StatusBadRequest, fmt.Sprintf("%d deliveries selected; at most %d at once", len(vals), maxSelected))
	}
	ids := make([]int64, 0, len(vals))
	for _, v := range vals {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id < 1 {
			return errorStatus(http.StatusBadRequest, fmt.Sprintf("%q is not a delivery id", v))
		}
		ids = append(ids, id)
	}
	if !confirmed {
		c.render(w, r, http.StatusOK, "revive", "Revive", map[string]any{"IDs": vals, "Count": len(ids)})
		return nil
	}
	revived, notRevived, err := c.actions.Revive(r.Context(), ids)
	if err != nil {
		return err
	}
	c.audit(r, audit.DeliveriesRevive, oneTarget(ids), plural(len(ids), "id", "ids"), int64(len(revived)))
	return selectionDone(c, w, r, s, "Revived", "delivery", "deliveries", len(revived), len(ids), notRevived,
		"/ui/deliveries/"+strconv.FormatInt(ids[0], 10), "/ui/deliveries?status=pending")
}

// recoverWindow reads the subscription and window of a recover (query or
// form: subscription, since, until).
func (c *Console) recoverWindow(r *http.Request, v url.Values) (*store.Subscription, store.Window, error) {
	w, err := store.ParseWindow(v.Get("since"), v.Get("until"), time.Now())
	if err != nil {
		return nil, w, errorStatus(http.StatusBadRequest, "Nothing revived: "+err.Error())
	}
	sub, err := c.subs.Get(r.Context(), v.Get("subscription"))
	if err != nil {
		return nil, w, err
	}
	return sub, w, nil
}

// recoverConfirm asks before reviving the dead deliveries of a
// subscription created in a window ("recover since T"), with the count.
func (c *Console) recoverConfirm(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	sub, win, err := c.recoverWindow(r, q)
	if err != nil {
		return err
	}
	n, err := c.deliveries.CountDeadWindow(r.Context(), sub.ID, win)
	if err != nil {
		return err
	}
	c.render(w, r, http.StatusOK, "revive", "Recover", map[string]any{"Sub": sub, "Count": n, "Window": win,
		"Since": q.Get("since"), "Until": q.Get("until")})
	return nil
}

func (c *Console) recover(w http.ResponseWriter, r *http.Request) error {
	sub, win, err := c.recoverWindow(r, r.PostForm)
	if err != nil {
		return err
	}
	if r.PostFormValue("confirmed") != "1" {
		http.Redirect(w, r, link("/ui/deliveries/recover", filterValues(r.PostForm, "subscription", "since", "until")), http.StatusSeeOther)
		return nil
	}
	// With the fast lane on the window is also read from the topics; the
	// rule is kafkawindow.RecoverWindow's, as for the CLI and the API.
	if c.cfg.KafkaWindowErr != nil {
		return fmt.Errorf("recover reads the window from Kafka (WEBHOOK_FAST_LANE=true), whose client could not be set up: %w", c.cfg.KafkaWindowErr)
	}
	rec, err := kafkawindow.RecoverWindow(r.Context(), c.pool, c.actions, c.cfg.KafkaWindow, sub, win)
	var re *kafkawindow.RetentionError
	if errors.As(err, &re) {
		return errorStatus(http.StatusBadRequest, "Nothing revived: "+err.Error())
	}
	if err != nil {
		return err
	}
	ids := rec.IDs
	changed := int64(len(ids))
	msg := fmt.Sprintf("Recovered %s (%s): pending again, with a fresh retry budget, in their original order.",
		plural(len(ids), "dead delivery", "dead deliveries"), audit.WindowScope(win.Since, win.Until))
	if rec.Kafka != nil {
		changed += int64(rec.Kafka.Queued)
		msg += fmt.Sprintf(" From Kafka: %s of the window read, %s queued again (those the subscription had no delivery of), in asset order.",
			plural(rec.Kafka.Read, "record", "records"), plural(rec.Kafka.Queued, "event", "events"))
	}
	c.audit(r, audit.DeliveriesRecover, sub.ID, audit.WindowScope(win.Since, win.Until), changed)
	c.setFlash(sessionFrom(r.Context()), msg)
	http.Redirect(w, r, link("/ui/deliveries", url.Values{"subscription": {sub.ID}, "status": {store.StatusPending}}), http.StatusSeeOther)
	return nil
}

// selectionDone tells the operator what became of the rows they selected —
// how many verb acted on ("Revived 2 of 3 selected deliveries.") and each
// one left alone, with the reason — and then shows that row when only one
// was selected (onePage), else listPage.
func selectionDone[ID any](c *Console, w http.ResponseWriter, r *http.Request, s *session, verb, one, many string, done, selected int,
	left []statement.LeftAlone[ID], onePage, listPage string) error {
	noun := many
	if selected == 1 {
		noun = one
	}
	msg := fmt.Sprintf("%s %d of %d selected %s at %s.", verb, done, selected, noun, time.Now().UTC().Format("15:04:05Z"))
	for _, l := range left {
		msg += fmt.Sprintf(" Not %s: %v %s.", strings.ToLower(verb), l.ID, l.Reason)
	}
	c.setFlash(s, msg)
	target := listPage
	if selected == 1 {
		target = onePage
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
	return nil
}

func (c *Console) streamPage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	sub, err := c.subs.Get(r.Context(), q.Get("subscription"))
	if err != nil {
		return err
	}
	asset := q.Get("asset")
	ds, open, err := c.deliveries.Stream(r.Context(), sub.ID, asset, pageSize)
	if err != nil {
		return err
	}
	c.render(w, r, http.StatusOK, "stream", "Stream", map[string]any{"Sub": sub, "Asset": asset, "Open": open, "Rows": ds,
		"Self": href("/ui/streams", url.Values{"subscription": {sub.ID}, "asset": {asset}}),
		"All":  href("/ui/deliveries", url.Values{"subscription": {sub.ID}, "asset": {asset}})})
	return nil
}

// Search ---------------------------------------------------------------------

// searchHit is one thing an id names.
type searchHit struct {
	Kind, Label, Href string
}

// search finds what an id names: an outbox row (its id, which is also the
// event's id and the webhook-id of its deliveries), a delivery (a number),
// an event's deliveries (event id / webhook-id, also test-… ids), a
// subscription. One hit goes straight to it.
func (c *Console) search(w http.ResponseWriter, r *http.Request) error {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	var hits []searchHit
	if q != "" {
		if n, err := strconv.ParseInt(q, 10, 64); err == nil && n > 0 {
			if d, err := c.deliveries.Get(r.Context(), n); err == nil {
				hits = append(hits, searchHit{"delivery", fmt.Sprintf("delivery %d (%s, %s)", d.ID, d.EventType, d.Status), "/ui/deliveries/" + q})
			} else if !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
		if id, err := uuid.Parse(q); err == nil {
			ok, err := outboxstore.Exists(r.Context(), c.pool, id)
			if err != nil {
				return err
			}
			if ok {
				hits = append(hits, searchHit{"outbox row", "outbox row " + id.String(), "/ui/outbox/" + id.String()})
			}
			if sub, err := c.subs.Get(r.Context(), id.String()); err == nil {
				hits = append(hits, searchHit{"subscription", "subscription " + sub.URL, "/ui/subscriptions/" + sub.ID})
			} else if !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
		if len(q) <= 200 {
			ds, err := c.deliveries.ByEvent(r.Context(), q)
			if err != nil {
				return err
			}
			for _, d := range ds {
				hits = append(hits, searchHit{"delivery", fmt.Sprintf("delivery %d of event %s to subscription %s (%s)", d.ID, d.EventID, short(d.SubscriptionID), d.Status),
					"/ui/deliveries/" + strconv.FormatInt(d.ID, 10)})
			}
		}
		if len(hits) == 1 {
			http.Redirect(w, r, hits[0].Href, http.StatusSeeOther)
			return nil
		}
	}
	c.render(w, r, http.StatusOK, "search", "Search", map[string]any{"Q": q, "Hits": hits})
	return nil
}

// Audit ----------------------------------------------------------------------

func (c *Console) auditPage(w http.ResponseWriter, r *http.Request) error {
	after := r.URL.Query().Get("after")
	es, next, err := audit.List(r.Context(), c.pool, pageSize, after)
	if err != nil {
		return errorStatus(http.StatusBadRequest, err.Error())
	}
	c.render(w, r, http.StatusOK, "audit", "Audit log", map[string]any{"Entries": es, "Next": next, "After": after != ""})
	return nil
}

// Helpers --------------------------------------------------------------------

// plural is "1 row", "2 rows".
func plural[N int | int64](n N, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return group(int64(n)) + " " + many
}

// scopeOf writes a filter as the audit log keeps it: "topic=orders
// error=too large", keys in order, values as typed.
func scopeOf(q url.Values) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(q)) {
		parts = append(parts, k+"="+q.Get(k))
	}
	return strings.Join(parts, " ")
}

// oneTarget is the id an action on one selected row names in the audit
// log ("" for several: the scope says how many).
func oneTarget[ID any](ids []ID) string {
	if len(ids) == 1 {
		return fmt.Sprint(ids[0])
	}
	return ""
}

func short(s string) string { return s[:min(8, len(s))] }

// Traces ---------------------------------------------------------------------

func (c *Console) tracePage(w http.ResponseWriter, r *http.Request) error {
	id := strings.ToLower(r.PathValue("id"))
	if !jaegerquery.ValidTraceID(id) {
		return errorStatus(http.StatusBadRequest, fmt.Sprintf("%q is not a trace id (32 hex digits)", id))
	}
	data := map[string]any{"ID": id}
	if c.cfg.JaegerUIURL != "" {
		data["UI"] = strings.TrimRight(c.cfg.JaegerUIURL, "/") + "/trace/" + id
	}
	status := http.StatusOK
	switch {
	case c.jaeger == nil:
		data["Problem"] = "JAEGER_QUERY_URL is not set, so the console cannot read traces. Set it to the Jaeger query service (e.g. http://127.0.0.1:16686)."
	default:
		tr, err := c.jaeger.Get(r.Context(), id)
		switch {
		case errors.Is(err, jaegerquery.ErrNotFound):
			status = http.StatusNotFound
			data["Problem"] = "Jaeger has no trace " + id + " (yet): spans are exported in batches a few seconds after they end, and Jaeger keeps them only as long as its storage does."
		case err != nil:
			status = http.StatusBadGateway
			data["Problem"] = err.Error()
		default:
			data["T"] = tr
		}
	}
	c.render(w, r, status, "trace", "Trace", data)
	return nil
}
