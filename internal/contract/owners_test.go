package contract_test

import (
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// tableOwners is the one package whose statements write each bridge table
// (docs/architecture.md, "Who owns which table"). Everyone else goes through
// that package's functions, so a table's rules (the lease fence on every
// outbox mark, the stream bookkeeping of every delivery outcome) cannot be
// skipped by a second writer that forgot them.
var tableOwners = map[string]string{
	"outbox_log":           "internal/outboxstore",
	"outbox_held":          "internal/outboxstore",
	"relay_positions":      "internal/outboxstore",
	"asset_counters":       "internal/outboxstore",
	"deliveries":           "internal/delivery/store",
	"delivery_streams":     "internal/delivery/store",
	"delivery_attempts":    "internal/delivery/store",
	"subscriptions":        "internal/delivery/store",
	"subscription_secrets": "internal/delivery/store",
	"consumer_inbox":       "internal/consumer",
	"relay_lanes":          "internal/relay",
	"relay_members":        "internal/relay",
	"audit_log":            "internal/audit",
	"delivery_parks":       "internal/delivery/store",
	"delivery_parks_gate":  "internal/delivery/store",
	"webhook_attempts":     "internal/delivery/store",
}

var writeStatement = regexp.MustCompile(`(?i)\b(?:insert\s+into|update|delete\s+from)\s+bridge\.([a-z_]+)`)

// TestEachTableHasOneWriter: no non-test Go file outside a table's owner
// holds a statement that inserts into, updates or deletes from it, and every
// table written anywhere has an owner in tableOwners.
func TestEachTableHasOneWriter(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".") && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		for _, lit := range stringLiterals(t, path) {
			for _, m := range writeStatement.FindAllStringSubmatch(lit.value, -1) {
				table := strings.ToLower(m[1])
				seen[table] = true
				owner, ok := tableOwners[table]
				switch {
				case !ok:
					t.Errorf("%s:%d writes bridge.%s, which has no owner in tableOwners: add it (and to docs/architecture.md)", rel, lit.line, table)
				case pkg != owner:
					t.Errorf("%s:%d writes bridge.%s, which only %s writes: call its functions instead", rel, lit.line, table, owner)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"outbox_log", "deliveries"} {
		if !seen[table] {
			t.Errorf("no statement writing bridge.%s was found: the scan is broken", table)
		}
	}
}
