package config

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
)

// Defaults is the configuration an empty environment gives: every envDefault
// tag, parsed (DATABASE_URL, which has none, stays empty). A stage takes the
// defaults of its environment-backed fields from here (through its
// ConfigFromEnv), so each default is written once, in its tag; the stage's
// field comments repeat it for the reader, and DocumentedDefaultMismatches
// checks that they agree.
func Defaults() Config {
	var cfg Config
	opts := env.Options{Environment: map[string]string{}}
	for _, p := range []any{&cfg.Log, &cfg.Kafka, &cfg.HTTP, &cfg.Relay, &cfg.Consumer, &cfg.Webhook, &cfg.Operations, &cfg.Schemas} {
		if err := env.ParseWithOptions(p, opts); err != nil {
			panic(fmt.Sprintf("config: an envDefault tag does not parse: %v", err))
		}
	}
	if err := env.ParseWithOptions(&cfg.Database, opts); err != nil && !isOnlyUnset(err) {
		panic(fmt.Sprintf("config: an envDefault tag does not parse: %v", err))
	}
	return cfg
}

// varInParens finds "(CONSUMER_GROUP)" in a stage's field comment: the
// variable the field is read from.
var varInParens = regexp.MustCompile(`\(([A-Z][A-Z0-9]*_[A-Z0-9_]+)\)`)

// documentedDefault finds "Default X" in a comment; X ends at a space or "(".
var documentedDefault = regexp.MustCompile(`\bDefault:? "?([^\s("]+)`)

// DocumentedDefaultMismatches reads a stage's Go source (its config.go) and
// returns one line for each struct field whose comment names the variable it
// is read from, in parentheses ("(CONSUMER_MAX_POLL_RECORDS)"), and
// documents a default ("Default 500") that is not that variable's envDefault.
// A stage's test calls it on its own source, so a default changed in a tag
// cannot leave a stale one in the stage's documentation.
func DocumentedDefaultMismatches(filename, src string) ([]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), filename, src, parser.ParseComments)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", filename, err)
	}
	d := Defaults()
	effective := map[string]string{}
	for _, s := range d.Settings() {
		effective[s.Var] = s.Value
	}
	var out []string
	checked := 0
	ast.Inspect(f, func(n ast.Node) bool {
		field, ok := n.(*ast.Field)
		if !ok || field.Doc == nil {
			return true
		}
		text := strings.Join(strings.Fields(field.Doc.Text()), " ")
		for _, m := range varInParens.FindAllStringSubmatch(text, -1) {
			v := m[1]
			want, known := effective[v]
			if !known {
				out = append(out, fmt.Sprintf("%s: comment names %s, which the configuration does not read", filename, v))
				continue
			}
			dm := documentedDefault.FindStringSubmatch(text)
			if dm == nil {
				continue
			}
			checked++
			got := strings.TrimRight(dm[1], ".,;")
			if got == "none" || got == "empty" {
				got = ""
			}
			if !SameSetting(got, want) {
				out = append(out, fmt.Sprintf("%s: %s is documented with default %q, its envDefault is %q", filename, v, got, want))
			}
		}
		return true
	})
	if checked == 0 && len(out) == 0 {
		return nil, fmt.Errorf("%s: no field comment names a variable and its default; nothing was checked", filename)
	}
	return out, nil
}

// SameSetting compares two spellings of a setting, treating durations (and
// lists of them) by value: "30m" == "30m0s".
func SameSetting(a, b string) bool {
	if a == b {
		return true
	}
	as, bs := strings.Split(a, ","), strings.Split(b, ",")
	if len(as) != len(bs) {
		return false
	}
	for i := range as {
		ad, err1 := time.ParseDuration(as[i])
		bd, err2 := time.ParseDuration(bs[i])
		if err1 != nil || err2 != nil || ad != bd {
			return false
		}
	}
	return true
}

// FillZero returns c with each of its zero exported fields set to the same
// field of defaults. The relay's and the consumer's withDefaults call it with the Config its
// ConfigFromEnv makes of Defaults(), so every environment-backed default is
// applied by one rule instead of a hand-kept list per stage that can miss a
// field added later. Fields whose default is not simply the env one (derived
// from another field, or not read from the environment) are set by the stage
// afterwards; fields left zero in defaults stay as they are.
func FillZero[T any](c, defaults T) T {
	v, d := reflect.ValueOf(&c).Elem(), reflect.ValueOf(defaults)
	if v.Kind() != reflect.Struct {
		panic(fmt.Sprintf("config.FillZero: %s is not a struct", v.Type()))
	}
	for i := range v.NumField() {
		if f := v.Field(i); f.CanSet() && f.IsZero() {
			f.Set(d.Field(i))
		}
	}
	return c
}

// DefaultsNotApplied compares a stage's Config after withDefaults with the
// Config its ConfigFromEnv makes of Defaults() and returns one line for each
// environment-backed field (non-zero in env) that applied does not carry:
// a default the stage forgot to apply, or applied differently.
func DefaultsNotApplied[T any](applied, env T) []string {
	a, e := reflect.ValueOf(applied), reflect.ValueOf(env)
	var out []string
	for i := range e.NumField() {
		f := e.Type().Field(i)
		if !f.IsExported() || e.Field(i).IsZero() {
			continue
		}
		if !reflect.DeepEqual(a.Field(i).Interface(), e.Field(i).Interface()) {
			out = append(out, fmt.Sprintf("%s: withDefaults gives %v, the environment default is %v", f.Name, a.Field(i), e.Field(i)))
		}
	}
	return out
}
