package contract_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestWireNamesLiveInTheContractOnly: every Kafka and webhook header name the
// contract declares (its Header* constants) appears as a string literal in no
// other non-test Go file of the repository. A second copy of a wire name is
// how two stages drift apart: a renamed header that one of them still writes
// the old way breaks every consumer silently. New Header* constants are found
// by reading the contract's source, so they are covered without editing this
// test.
func TestWireNamesLiveInTheContractOnly(t *testing.T) {
	t.Parallel()
	names := headerNames(t)
	if len(names) < 10 {
		t.Fatalf("found only %d Header* constants in the contract: %v", len(names), names)
	}
	root := filepath.Join("..", "..")
	// Same word, other meaning: a column of bridge.deliveries named after
	// the header it came from.
	columns := map[string]bool{
		"internal/delivery/store/enqueue.go traceparent": true,
		"internal/delivery/store/enqueue.go tracestate":  true,
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == filepath.Join(root, "internal", "contract") || d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".") && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || filepath.Dir(path) == "." {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		for _, lit := range stringLiterals(t, path) {
			if name, ok := names[lit.value]; ok && !columns[filepath.ToSlash(rel)+" "+lit.value] {
				t.Errorf("%s:%d: the wire name %q is written out; use contract.%s", path, lit.line, lit.value, name)
			}
			// HTTP canonicalises header names (Webhook-Id): the same name.
			if name, ok := names[strings.ToLower(lit.value)]; ok && strings.HasPrefix(name, "HeaderWebhook") && lit.value != strings.ToLower(lit.value) {
				t.Errorf("%s:%d: the webhook header %q is written out; use contract.%s", path, lit.line, lit.value, name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestWireNamesAreDocumented: every header name the contract declares is in
// docs/contract.md (as `name`), where producers and receivers outside the
// repository learn it. A header the code writes but the contract does not
// name is one nobody else can rely on or know to drop.
func TestWireNamesAreDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "contract.md"))
	if err != nil {
		t.Fatal(err)
	}
	for value, name := range headerNames(t) {
		if !strings.Contains(string(doc), "`"+value+"`") {
			t.Errorf("contract.%s (%q) is not in docs/contract.md", name, value)
		}
	}
}

// headerNames reads the contract package's own source: value → constant name
// of every Header* string constant.
func headerNames(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, id := range vs.Names {
				if !strings.HasPrefix(id.Name, "Header") || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					names[v] = id.Name
				}
			}
			return true
		})
	}
	return names
}

type literal struct {
	value string
	line  int
}

// stringLiterals returns the string literals of a Go file, struct tags left
// out (a JSON field may share a header's name without being one).
func stringLiterals(t *testing.T, path string) []literal {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	tags := map[*ast.BasicLit]bool{}
	var lits []literal
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.Field:
			if n.Tag != nil {
				tags[n.Tag] = true
			}
		case *ast.BasicLit:
			if n.Kind == token.STRING && !tags[n] {
				if v, err := strconv.Unquote(n.Value); err == nil {
					lits = append(lits, literal{v, fset.Position(n.Pos()).Line})
				}
			}
		}
		return true
	})
	return lits
}
