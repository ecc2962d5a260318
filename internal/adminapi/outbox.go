package adminapi

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/outboxbridge/bridge/internal/audit"
	"github.com/outboxbridge/bridge/internal/outboxstore"
)

// maxIDs bounds the ids of one replay or revive request, so one request is
// one statement of bounded cost.
const maxIDs = 10000

func (a *adminAPI) outboxStats(w http.ResponseWriter, r *http.Request) error {
	if _, err := query(r); err != nil {
		return err
	}
	st, err := outboxstore.ReadStats(r.Context(), a.pool)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

func (a *adminAPI) outboxFailed(w http.ResponseWriter, r *http.Request) error {
	q, limit, pos, err := pageQuery(r, cursorFailed, "topic")
	if err != nil {
		return err
	}
	var after int64
	if pos != "" {
		if after, err = strconv.ParseInt(pos, 10, 64); err != nil || after < 0 {
			return badRequest("cursor", "is not a next_cursor returned by this list")
		}
	}
	items, err := outboxstore.ListFailed(r.Context(), a.pool, q.Get("topic"), limit+1, false, after)
	if err != nil {
		return err
	}
	page := List[outboxstore.FailedRow]{Items: items}
	if page.Items == nil {
		page.Items = []outboxstore.FailedRow{}
	}
	if len(items) > limit {
		page.Items = items[:limit]
		page.NextCursor = encodeCursor(cursorFailed, strconv.FormatInt(items[limit-1].Seq, 10))
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

type replayRequest struct {
	IDs       []string `json:"ids"`
	AllFailed bool     `json:"all_failed"`
	Topic     *string  `json:"topic"`
	Since     *string  `json:"since"`
}

type replayResponse struct {
	Replayed int64 `json:"replayed"`
	// NotReplayed lists each id given that was left alone, with the
	// reason (no such row, not FAILED); absent when every id was replayed
	// and with all_failed.
	NotReplayed []outboxstore.NotReplayed `json:"not_replayed,omitempty"`
}

func (a *adminAPI) outboxReplay(w http.ResponseWriter, r *http.Request) error {
	req, err := body[replayRequest](w, r, false)
	if err != nil {
		return err
	}
	switch {
	case req.IDs == nil && !req.AllFailed:
		return badRequest("ids", `give "ids" (FAILED row ids) or "all_failed": true`)
	case req.IDs != nil && req.AllFailed:
		return badRequest("all_failed", `give either "ids" or "all_failed", not both`)
	case req.IDs != nil && req.Topic != nil:
		return badRequest("topic", `"topic" only narrows "all_failed"`)
	case req.IDs != nil && req.Since != nil:
		return badRequest("since", `"since" only narrows "all_failed"`)
	}
	var n int64
	var skipped []outboxstore.NotReplayed
	var action, target, scope string
	if req.AllFailed {
		var topic string
		var since time.Duration
		if req.Topic != nil {
			if err := checkText("topic", *req.Topic); err != nil {
				return err
			}
			topic = *req.Topic
		}
		if req.Since != nil {
			since, err = time.ParseDuration(*req.Since)
			if err != nil || since <= 0 {
				return badRequest("since", fmt.Sprintf("%q is not a positive Go duration (e.g. 90m, 2h)", *req.Since))
			}
		}
		n, err = outboxstore.ReplayAllFailed(r.Context(), a.pool, topic, since)
		action, scope = audit.OutboxReplayMatching, "all FAILED"
		if topic != "" {
			scope += " topic=" + topic
		}
		if since > 0 {
			scope += " failed within " + since.String()
		}
	} else {
		ids, verr := parseUUIDs(req.IDs)
		if verr != nil {
			return verr
		}
		var replayed []uuid.UUID
		replayed, skipped, err = outboxstore.ReplayIDs(r.Context(), a.pool, ids)
		n = int64(len(replayed))
		action, scope = audit.OutboxReplayIDs, fmt.Sprintf("%d ids", len(ids))
		if len(ids) == 1 {
			target = ids[0].String()
		}
	}
	if err != nil {
		return err
	}
	a.audit(r, action, target, scope, n)
	writeJSON(w, http.StatusOK, replayResponse{Replayed: n, NotReplayed: skipped})
	return nil
}

// parseUUIDs checks every id before anything is written.
func parseUUIDs(in []string) ([]uuid.UUID, error) {
	if len(in) == 0 {
		return nil, badRequest("ids", "must list at least one id")
	}
	if len(in) > maxIDs {
		return nil, badRequest("ids", fmt.Sprintf("lists %d ids; at most %d per request", len(in), maxIDs))
	}
	out := make([]uuid.UUID, len(in))
	for i, s := range in {
		id, err := uuid.Parse(s)
		if err != nil {
			return nil, badRequest(fmt.Sprintf("ids[%d]", i), fmt.Sprintf("%q is not a UUID", s))
		}
		out[i] = id
	}
	return out, nil
}
