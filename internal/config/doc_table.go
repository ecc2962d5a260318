package config

import (
	_ "embed"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// TracingVars are the standard OpenTelemetry variables the bridge reads
// (internal/tracing.ConfigFromEnv, and the OTLP exporter for the last four).
// They are not fields of Config: tracing reads them itself, under the names
// every OpenTelemetry SDK uses. A test checks this list against the
// variables internal/tracing names.
var TracingVars = []string{
	"OTEL_SERVICE_NAME",
	"OTEL_RESOURCE_ATTRIBUTES",
	"OTEL_SDK_DISABLED",
	"OTEL_TRACES_EXPORTER",
	"OTEL_EXPORTER_OTLP_ENDPOINT",
	"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
	"OTEL_EXPORTER_OTLP_PROTOCOL",
	"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
	"OTEL_TRACES_SAMPLER",
	"OTEL_TRACES_SAMPLER_ARG",
	"OTEL_EXPORTER_OTLP_HEADERS",
	"OTEL_EXPORTER_OTLP_TIMEOUT",
	"OTEL_EXPORTER_OTLP_COMPRESSION",
	"OTEL_EXPORTER_OTLP_CERTIFICATE",
}

// MetricsVars are the standard OpenTelemetry variables the metrics' OTLP
// push reads (internal/metrics.otlp), beside the shared OTLP ones above.
var MetricsVars = []string{
	"OTEL_METRICS_EXPORTER",
	"OTEL_METRIC_EXPORT_INTERVAL",
	"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
	"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
}

// configSource is config.go itself: the field comments are the one place
// each variable is described, and docs/configuration.md's table is generated from them.
//
//go:embed config.go
var configSource string

// VarDoc documents one variable, as docs/configuration.md's table shows it.
type VarDoc struct {
	Component   string // the Config field: Log, Database, …
	Var         string
	Default     string // envDefault; "" when none
	Required    bool   // required by the env tag (always, not per command)
	Description string // the field's comment without the "VAR:" lead
}

// ComponentDoc is one component struct and its variables.
type ComponentDoc struct {
	Name string
	// Doc is the struct's comment without its leading name ("configures
	// `bridge relay`.").
	Doc  string
	Vars []VarDoc
}

// Docs reads the variables' documentation from the struct tags (names,
// defaults) and the field comments of config.go (descriptions), in the
// order of Config's fields.
func Docs() ([]ComponentDoc, error) { return docsFrom(configSource) }

// docsFrom is Docs on a given config.go (tests).
func docsFrom(src string) ([]ComponentDoc, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "config.go", src, parser.ParseComments)
	if err != nil {
		return nil, fmt.Errorf("parse config.go: %w", err)
	}
	structs := map[string]*ast.StructType{}
	structDocs := map[string]string{}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.TYPE {
			continue
		}
		for _, s := range gd.Specs {
			ts := s.(*ast.TypeSpec)
			if st, ok := ts.Type.(*ast.StructType); ok {
				structs[ts.Name.Name] = st
				structDocs[ts.Name.Name] = gd.Doc.Text()
			}
		}
	}
	var out []ComponentDoc
	ct := reflect.TypeFor[Config]()
	for i := range ct.NumField() {
		st := ct.Field(i).Type
		node, ok := structs[st.Name()]
		if !ok {
			return nil, fmt.Errorf("config.go: no struct %s", st.Name())
		}
		comp := ComponentDoc{Name: ct.Field(i).Name, Doc: oneLine(strings.TrimPrefix(structDocs[st.Name()], st.Name()+" "))}
		comments := fieldComments(node)
		for j := range st.NumField() {
			f := st.Field(j)
			name, opts, _ := strings.Cut(f.Tag.Get("env"), ",")
			if name == "" {
				continue
			}
			v := VarDoc{Component: comp.Name, Var: name, Default: f.Tag.Get("envDefault"), Required: hasOpt(opts, "required")}
			v.Description = describeVar(comments, j, name, v)
			if v.Description == "" {
				return nil, fmt.Errorf("config.go: %s.%s (%s) has no comment", st.Name(), f.Name, name)
			}
			comp.Vars = append(comp.Vars, v)
		}
		out = append(out, comp)
	}
	return out, nil
}

// fieldComments lists each field's doc comment, by field index (one name
// per field, as config.go declares them).
func fieldComments(st *ast.StructType) []string {
	var out []string
	for _, f := range st.Fields.List {
		for range max(1, len(f.Names)) {
			out = append(out, f.Doc.Text())
		}
	}
	return out
}

// describeVar is field i's comment. A field without one shares the comment
// above it when that comment names it ("KAFKA_TLS_CERT_FILE /
// KAFKA_TLS_KEY_FILE: client certificate for mTLS.").
func describeVar(comments []string, i int, name string, v VarDoc) string {
	c := comments[i]
	for k := i - 1; c == "" && k >= 0; k-- {
		if strings.Contains(comments[k], name) {
			c = comments[k]
		}
		if comments[k] != "" {
			break
		}
	}
	c = oneLine(c)
	c = leadingVars.ReplaceAllString(c, "")
	// The Default column says these; the comment's words for them would
	// only repeat it. Fuller sentences ("Default 7s, which spreads …") stay.
	if v.Default != "" {
		c = strings.TrimSpace(strings.Replace(c, "Default "+v.Default+".", "", 1))
	}
	if v.Required {
		c = strings.TrimSpace(strings.TrimSuffix(c, "Required."))
	}
	if r, size := utf8.DecodeRuneInString(c); size > 0 {
		c = string(unicode.ToUpper(r)) + c[size:]
	}
	return c
}

// leadingVars matches a comment's "VAR:" or "VAR / VAR2:" lead.
var leadingVars = regexp.MustCompile(`^[A-Z][A-Z0-9_]*( / [A-Z][A-Z0-9_]*)*: `)

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func hasOpt(opts, want string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}

// MarkdownTable renders Docs as docs/configuration.md's table: one
// table per component, then the OpenTelemetry variables.
func MarkdownTable() (string, error) {
	comps, err := Docs()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("<!-- Generated from internal/config/config.go; edit the field comments there, then run\n")
	b.WriteString("     go test ./internal/config -run TestConfigurationDocTable -update -->\n")
	for _, c := range comps {
		fmt.Fprintf(&b, "\n**%s** — %s\n\n", c.Name, c.Doc)
		b.WriteString("| Variable | Default | Description |\n|---|---|---|\n")
		for _, v := range c.Vars {
			def := "—"
			switch {
			case v.Required:
				def = "**required**"
			case v.Default != "":
				def = "`" + v.Default + "`"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", v.Var, def, cell(v.Description))
		}
	}
	b.WriteString("\n**Tracing** — the standard OpenTelemetry variables (see [observability.md](observability.md)); unset `OTEL_EXPORTER_OTLP_ENDPOINT`: no export, trace context still travels: ")
	for i, v := range TracingVars {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("`" + v + "`")
	}
	b.WriteString(".\n")
	return b.String(), nil
}

// cell makes s safe inside a Markdown table cell.
func cell(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}
