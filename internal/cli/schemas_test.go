package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxbridge/bridge/internal/schematest"
)

// bridge schemas register/list/show against the real registry: a compatible
// evolution is version 2, an incompatible one exits 1 with the registry's own
// reason, and show lists both versions. Without SCHEMA_REGISTRY_URL the
// command exits 2 naming the variable.
func TestCLISchemasRegisterListShow(t *testing.T) {
	t.Parallel()
	env := map[string]string{"SCHEMA_REGISTRY_URL": schematest.URL(t)}
	topic := schematest.Topic(t)
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v1 := write("v1.json", `{"type":"object","properties":{"id":{"type":"string"}},"required":["id"],"additionalProperties":false}`)
	v2 := write("v2.json", `{"type":"object","properties":{"id":{"type":"string"},"note":{"type":"string"}},"required":["id"],"additionalProperties":false}`)
	bad := write("bad.json", `{"type":"object","properties":{"id":{"type":"integer"}},"required":["id"],"additionalProperties":false}`)

	if r := bridge(t, env, "schemas", "register", topic, "--file", v1, "--compatibility", "BACKWARD"); r.code != 0 || !strings.Contains(r.stdout, "version 1") {
		t.Fatalf("register v1: %+v", r)
	}
	if r := bridge(t, env, "schemas", "register", topic, "--file", v2); r.code != 0 || !strings.Contains(r.stdout, "version 2") {
		t.Fatalf("register v2: %+v", r)
	}
	r := bridge(t, env, "schemas", "register", topic, "--file", bad)
	if r.code != 1 || !strings.Contains(r.stderr, "Incompatible") || !strings.Contains(r.stderr, "/properties/id") {
		t.Fatalf("register an incompatible schema: %+v, want exit 1 with the registry's reason", r)
	}
	r = bridge(t, env, "schemas", "show", topic, "-o", "json")
	var shown struct {
		Items []struct {
			Topic   string `json:"topic"`
			Version int    `json:"version"`
			Type    string `json:"type"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &shown); err != nil || len(shown.Items) != 2 || shown.Items[1].Version != 2 || shown.Items[0].Type != "JSON" {
		t.Fatalf("show: %+v (%v)", r, err)
	}
	if r := bridge(t, env, "schemas", "list"); r.code != 0 || !strings.Contains(r.stdout, topic) {
		t.Fatalf("list: %+v", r)
	}
	if r := bridge(t, nil, "schemas", "list"); r.code != 2 || !strings.Contains(r.stderr, "SCHEMA_REGISTRY_URL") {
		t.Fatalf("list without SCHEMA_REGISTRY_URL: %+v, want exit 2 naming it", r)
	}
}
