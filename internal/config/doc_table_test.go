package config

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md's table from config.go")

const (
	tableStart = "<!-- config-table:start -->"
	tableEnd   = "<!-- config-table:end -->"
)

// TestConfigurationDocTable fails when docs/configuration.md's table is not
// what config.go's tags and comments generate: a variable in the code and
// not in the doc, or in the doc and not in the code, or with another default
// or description. -update rewrites it (only the text between the markers).
func TestConfigurationDocTable(t *testing.T) {
	readme := filepath.Join("..", "..", "docs", "configuration.md")
	raw, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	i, j := strings.Index(text, tableStart), strings.Index(text, tableEnd)
	if i < 0 || j < i || strings.Count(text, tableStart) != 1 || strings.Count(text, tableEnd) != 1 {
		t.Fatalf("docs/configuration.md needs exactly one %s … %s pair, in that order", tableStart, tableEnd)
	}
	table, err := MarkdownTable()
	if err != nil {
		t.Fatal(err)
	}
	want := text[:i+len(tableStart)] + "\n" + table + text[j:]
	if want == text {
		return
	}
	if *update {
		if err := os.WriteFile(readme, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Log("docs/configuration.md's table rewritten")
		return
	}
	got := text[i+len(tableStart) : j]
	t.Fatalf("docs/configuration.md's table differs from internal/config/config.go.\n"+
		"Regenerate it with:\n\n    go test ./internal/config -run TestConfigurationDocTable -update\n\n"+
		"first difference:\n%s", firstDiff(got, "\n"+table))
}

func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for k := 0; k < max(len(g), len(w)); k++ {
		var gl, wl string
		if k < len(g) {
			gl = g[k]
		}
		if k < len(w) {
			wl = w[k]
		}
		if gl != wl {
			return "  doc:       " + gl + "\n  generated: " + wl
		}
	}
	return "(whitespace only)"
}

// Every variable Load reads is documented, once, with a description.
func TestDocsCoverEveryVar(t *testing.T) {
	t.Parallel()
	comps, err := Docs()
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, c := range comps {
		if c.Doc == "" {
			t.Errorf("component %s has no struct comment", c.Name)
		}
		for _, v := range c.Vars {
			documented = append(documented, v.Var)
			if v.Description == "" || strings.HasPrefix(v.Description, v.Var) {
				t.Errorf("%s: description %q", v.Var, v.Description)
			}
		}
	}
	vars := Vars()
	sort.Strings(documented)
	sort.Strings(vars)
	if !slices.Equal(documented, vars) {
		t.Fatalf("documented %v\nVars()     %v", documented, vars)
	}
}

func TestDocsDetails(t *testing.T) {
	t.Parallel()
	comps, err := Docs()
	if err != nil {
		t.Fatal(err)
	}
	byVar := map[string]VarDoc{}
	for _, c := range comps {
		for _, v := range c.Vars {
			byVar[v.Var] = v
		}
	}
	for _, tc := range []struct {
		name     string
		def      string
		required bool
		desc     string
	}{
		{"DATABASE_URL", "", true, "PostgreSQL connection string (URL or key=value form)."},
		{"LOG_LEVEL", "info", false, "Debug, info, warn or error."},
		// A field sharing the comment above it.
		{"KAFKA_TLS_KEY_FILE", "", false, "Client certificate for mTLS."},
		{"KAFKA_SASL_PASSWORD", "", false, "SASL credentials."},
		{"RELAY_MAX_ATTEMPTS", "10", false, "Failed sends that belong to a row before it is parked as FAILED."},
	} {
		v := byVar[tc.name]
		if v.Default != tc.def || v.Required != tc.required || v.Description != tc.desc {
			t.Errorf("%s: %+v, want default %q required %v description %q", tc.name, v, tc.def, tc.required, tc.desc)
		}
	}
}

// A variable without a comment is an error, not an empty cell.
func TestDocsRefuseUncommentedField(t *testing.T) {
	t.Parallel()
	src := strings.Replace(configSource, "	// DATABASE_MAX_CONNS: pool size. Default 10.\n", "", 1)
	if src == configSource {
		t.Fatal("test fixture: DATABASE_MAX_CONNS comment not found in config.go")
	}
	if _, err := docsFrom(src); err == nil || !strings.Contains(err.Error(), "DATABASE_MAX_CONNS") {
		t.Fatalf("docsFrom without a comment: %v", err)
	}
}

// TracingVars covers every OTEL_* variable internal/tracing names.
func TestTracingVarsMatchTracing(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("..", "tracing", "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("internal/tracing sources: %v", err)
	}
	re := regexp.MustCompile(`"(OTEL_[A-Z_]+)"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			if !slices.Contains(TracingVars, m[1]) {
				t.Errorf("%s reads %s; add it to config.TracingVars", f, m[1])
			}
		}
	}
}

// TestDocumentedDefaultMismatchesCatchesAStaleComment: the check a stage
// runs on its own Config finds a comment whose default disagrees with the
// tag, accepts one that agrees (durations by value), and refuses a source
// in which it checked nothing.
func TestDocumentedDefaultMismatchesCatchesAStaleComment(t *testing.T) {
	t.Parallel()
	src := `package stage
type Config struct {
	// Records per poll (CONSUMER_MAX_POLL_RECORDS). Default 400.
	MaxPollRecords int
	// Session (CONSUMER_SESSION_TIMEOUT). Default 6000ms.
	SessionTimeout int
	// Group (CONSUMER_GROUP). Default "outbox-bridge".
	Group string
}
`
	bad, err := DocumentedDefaultMismatches("stage.go", src)
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) != 1 || !strings.Contains(bad[0], "CONSUMER_MAX_POLL_RECORDS") || !strings.Contains(bad[0], `"400"`) {
		t.Fatalf("mismatches %q, want exactly the stale CONSUMER_MAX_POLL_RECORDS", bad)
	}
	if _, err := DocumentedDefaultMismatches("empty.go", "package stage\ntype Config struct{ X int }\n"); err == nil {
		t.Fatal("a source with nothing to check passed")
	}
}

// envName is a backquoted name with a prefix of the bridge's variables.
var envName = regexp.MustCompile("`((?:LOG|DATABASE|KAFKA|HTTP|ADMIN|JAEGER|RELAY|CONSUMER|WEBHOOK|BRIDGE|OTEL)_[A-Z0-9_]+)")

// notBridgeVars are names with those prefixes that are not the bridge's
// configuration: the test helpers' and scripts/services-up.sh's.
var notBridgeVars = []string{"BRIDGE_TEST_JAEGER_OTLP", "BRIDGE_TEST_JAEGER_QUERY", "KAFKA_CLUSTER_BROKERS", "KAFKA_CLUSTER_PORTS", "KAFKA_PORT", "KAFKA_CONTROLLER_PORT"}

// TestDocsNameOnlyRealVariables: every variable the README and
// docs/configuration.md name outside the generated table is one the code
// reads, so renaming or removing a variable cannot leave prose pointing at
// it.
func TestDocsNameOnlyRealVariables(t *testing.T) {
	t.Parallel()
	known := slices.Concat(Vars(), TracingVars, MetricsVars)
	for _, doc := range []string{"README.md", filepath.Join("docs", "configuration.md"), filepath.Join("docs", "operations.md")} {
		raw, err := os.ReadFile(filepath.Join("..", "..", doc))
		if err != nil {
			t.Fatal(err)
		}
		text := string(raw)
		if i, j := strings.Index(text, tableStart), strings.Index(text, tableEnd); i >= 0 && j > i {
			text = text[:i] + text[j:]
		}
		for _, m := range envName.FindAllStringSubmatch(text, -1) {
			if !slices.Contains(known, m[1]) && !slices.Contains(notBridgeVars, m[1]) {
				t.Errorf("%s names %s, which no code reads (config.Vars, config.TracingVars, config.MetricsVars)", doc, m[1])
			}
		}
	}
}
