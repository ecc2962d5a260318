package adminapi

import (
	"errors"
	"net/http"

	"github.com/outboxbridge/bridge/outbox/schema"
)

// Schema-governed topics (docs/contract.md, "Schema-governed topics"): what
// the registry at SCHEMA_REGISTRY_URL holds, read-only. Registering is
// `bridge schemas register`.

func (a *adminAPI) noRegistry() error {
	return &apiError{Status: http.StatusNotFound, Field: "SCHEMA_REGISTRY_URL", Message: "no schema registry: SCHEMA_REGISTRY_URL is not set, so no topic is governed"}
}

func (a *adminAPI) listSchemas(w http.ResponseWriter, r *http.Request) error {
	if _, err := query(r); err != nil {
		return err
	}
	if a.schemas == nil {
		return a.noRegistry()
	}
	items, err := a.schemas.List(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, List[schema.Version]{Items: items})
	return nil
}

func (a *adminAPI) schemaHistory(w http.ResponseWriter, r *http.Request) error {
	if _, err := query(r); err != nil {
		return err
	}
	topic := r.PathValue("topic")
	if err := checkText("topic", topic); err != nil {
		return err
	}
	if a.schemas == nil {
		return a.noRegistry()
	}
	items, err := a.schemas.History(r.Context(), topic)
	if errors.Is(err, schema.ErrNotGoverned) {
		return &apiError{Status: http.StatusNotFound, Field: "topic", Message: err.Error()}
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, List[schema.Version]{Items: items})
	return nil
}
