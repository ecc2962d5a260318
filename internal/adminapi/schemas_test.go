package adminapi

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/schematest"
	"github.com/outboxbridge/bridge/outbox/schema"
)

// GET /api/v1/schemas and /api/v1/schemas/{topic} against the real
// registry; without one both answer 404 naming SCHEMA_REGISTRY_URL.
func TestSchemaEndpoints(t *testing.T) {
	reg, err := schema.New(schema.Config{URL: schematest.URL(t), RefreshInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	db := pgtest.NewParallel(t)
	sawDB.Store(true)
	mux := http.NewServeMux()
	if !Mount(mux, Config{Token: testToken, Pool: db.Pool, AllowHTTP: true, SecretGrace: time.Hour, Schemas: reg}) {
		t.Fatal("Mount with a token mounted nothing")
	}
	b := &bundle{db: db, mux: mux}
	topic := schematest.Topic(t)
	ctx := context.Background()
	for _, s := range []string{
		`{"type":"object","properties":{"id":{"type":"string"}},"required":["id"],"additionalProperties":false}`,
		`{"type":"object","properties":{"id":{"type":"string"},"n":{"type":"integer"}},"required":["id"],"additionalProperties":false}`,
	} {
		if _, err := reg.Register(ctx, topic, sr.TypeJSON, s, "BACKWARD"); err != nil {
			t.Fatal(err)
		}
	}

	items := b.do(t, "GET", "/api/v1/schemas/"+topic, "").want(t, http.StatusOK).items(t)
	if len(items) != 2 || items[1]["version"] != float64(2) || items[0]["subject"] != schema.Subject(topic) || items[0]["type"] != "JSON" {
		t.Fatalf("history = %v", items)
	}
	found := false
	for _, it := range b.do(t, "GET", "/api/v1/schemas", "").want(t, http.StatusOK).items(t) {
		found = found || (it["topic"] == topic && it["version"] == float64(2))
	}
	if !found {
		t.Fatalf("GET /api/v1/schemas does not list %s at version 2", topic)
	}
	b.do(t, "GET", "/api/v1/schemas/"+schematest.Topic(t), "").wantError(t, http.StatusNotFound, "topic")
	b.do(t, "GET", "/api/v1/schemas?x=1", "").wantError(t, http.StatusBadRequest, "x")
	b.do(t, "GET", "/api/v1/schemas/"+topic+"?x=1", "").wantError(t, http.StatusBadRequest, "x")
	b.doAuth(t, "GET", "/api/v1/schemas", "", "").want(t, http.StatusUnauthorized)
	b.doAuth(t, "GET", "/api/v1/schemas/"+topic, "", "").want(t, http.StatusUnauthorized)

	// No registry configured.
	plain := http.NewServeMux()
	Mount(plain, Config{Token: testToken, Pool: db.Pool})
	nb := &bundle{db: db, mux: plain}
	nb.do(t, "GET", "/api/v1/schemas", "").wantError(t, http.StatusNotFound, "SCHEMA_REGISTRY_URL")
	nb.do(t, "GET", "/api/v1/schemas/"+topic, "").wantError(t, http.StatusNotFound, "SCHEMA_REGISTRY_URL")
}
