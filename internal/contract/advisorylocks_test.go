package contract_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The bridge takes advisory locks in the application's own database, so its
// keys are part of the contract: an application lock on one of them makes a
// replica wait, or makes the relays' wake-up skip a notification. Every key
// the code or a migration locks must be in docs/contract.md's "Advisory
// locks" table, or a new one would reach users undocumented.
func TestEveryAdvisoryLockKeyIsInTheContract(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "contract.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "### Advisory locks")
	if !ok {
		t.Fatal(`docs/contract.md has no "### Advisory locks" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	documented := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		line = strings.ReplaceAll(line, `\|`, "¦") // an escaped pipe inside a cell
		if cells := strings.Split(line, "|"); len(cells) > 2 && strings.HasPrefix(line, "| `") {
			for _, m := range regexp.MustCompile("`\\(?([^`,]+),?([^`]*)`").FindAllStringSubmatch(cells[1], -1) {
				documented[lockKey(m[1], strings.TrimSuffix(strings.TrimSpace(m[2]), ")"))] = true
			}
		}
	}

	// The arguments of every advisory-lock call: the key, or the class of a
	// two-int key and its second int when that is a literal.
	call := regexp.MustCompile(`pg_(?:try_)?advisory_(?:xact_)?(?:un)?lock(?:_shared)?\(\s*([^,)]+)(?:,\s*([^,)]+))?`)
	goose := regexp.MustCompile(`migrationLockID\s*=\s*(0x[0-9a-fA-F]+)`)
	found := 0
	for _, dir := range []string{"internal", "migrations"} {
		err := filepath.WalkDir(filepath.Join("..", "..", dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			// pgtest's lock serialises test-template creation in the test
			// cluster only; it never runs against a user's database.
			if strings.HasSuffix(path, "_test.go") || strings.Contains(path, filepath.Join("internal", "pgtest")) ||
				!(strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".sql")) {
				return nil
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range append(call.FindAllStringSubmatch(string(src), -1), goose.FindAllStringSubmatch(string(src), -1)...) {
				found++
				if key := lockKey(m[1], m[len(m)-1]); !documented[key] {
					t.Errorf("%s locks advisory key %q, which docs/contract.md's \"Advisory locks\" table does not list", path, key)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if found < 5 {
		t.Fatalf("found %d advisory-lock calls in the code; the scan no longer matches how the code takes them", found)
	}
}

// lockKey normalises a key as written in SQL, Go or the docs:
// x'6F410000'::int, 4 and (x'6F410000', 4) are both "x'6f410000',4"; a
// second int that is not a literal (hashtext(…), the seq's low bits) leaves
// the class alone.
func lockKey(first, second string) string {
	key, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(first)), "::")
	key, _, _ = strings.Cut(key, " ")
	second = strings.TrimSpace(second)
	if second != "" && strings.Trim(second, "0123456789") == "" {
		key += "," + second
	}
	return key
}
