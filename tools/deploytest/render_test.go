package deploytest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/yaml"
)

// root is the repository (this module lives in tools/deploytest).
var root = filepath.Join("..", "..")

var chartDir = filepath.Join(root, "deploy", "helm", "outbox-bridge")

const (
	releaseName = "bridge-test"
	namespace   = "pipelines"
)

// kubeVersion is the cluster version the chart is rendered for: the one the
// k8s.io/api types in go.mod describe.
const kubeVersion = "v1.37.0"

// manifest is one rendered document: the template it came from, its
// apiVersion and kind, and its YAML.
type manifest struct {
	Source     string
	APIVersion string
	Kind       string
	Name       string
	YAML       []byte
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return ch
}

// valuesFile reads one of the chart's values files; "" is the defaults
// (nothing on top of values.yaml). Files joined with "+" are layered as
// `helm -f a -f b` layers them: a later file's fields replace an earlier
// one's.
func valuesFile(t *testing.T, name string) map[string]any {
	t.Helper()
	out := map[string]any{}
	if name == "" {
		return out
	}
	for _, f := range strings.Split(name, "+") {
		v, err := chartutil.ReadValuesFile(filepath.Join(chartDir, f))
		if err != nil {
			t.Fatalf("read %s: %v", f, err)
		}
		out = chartutil.MergeTables(v.AsMap(), out)
	}
	return out
}

// render renders the chart as `helm template` (an install) would, with the
// engine in strict mode: a template reading a value that does not exist is
// an error, not an empty string.
func render(ch *chart.Chart, vals map[string]any) ([]manifest, error) {
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{
		Name: releaseName, Namespace: namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, err
	}
	out, err := engine.Engine{Strict: true}.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(out))
	for name := range out {
		names = append(names, name)
	}
	sort.Strings(names)
	var ms []manifest
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") || strings.HasPrefix(filepath.Base(name), "_") {
			continue
		}
		for _, doc := range splitDocs(out[name]) {
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal(doc, &head); err != nil {
				return nil, fmt.Errorf("%s: not YAML: %v\n%s", name, err, doc)
			}
			ms = append(ms, manifest{Source: name, APIVersion: head.APIVersion, Kind: head.Kind, Name: head.Metadata.Name, YAML: doc})
		}
	}
	return ms, nil
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// splitDocs splits a rendered template into its YAML documents, dropping
// the empty ones (comments only, or whitespace).
func splitDocs(s string) [][]byte {
	var out [][]byte
	for _, part := range docSep.Split(s, -1) {
		empty := true
		for _, line := range strings.Split(part, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				empty = false
				break
			}
		}
		if !empty {
			out = append(out, bytes.TrimSpace([]byte(part)))
		}
	}
	return out
}

// valueSets are the values every structural test runs against: the
// defaults (the fast lane), every option on, the single-Deployment mode,
// and the row engine (delivery.fastLane: false) alone and with every option
// on.
var valueSets = []string{"", "ci/all-options-values.yaml", "ci/run-mode-values.yaml", "ci/row-engine-values.yaml", "ci/all-options-values.yaml+ci/row-engine-values.yaml"}

func setName(file string) string {
	if file == "" {
		return "defaults"
	}
	var names []string
	for _, f := range strings.Split(file, "+") {
		names = append(names, strings.TrimSuffix(filepath.Base(f), "-values.yaml"))
	}
	return strings.Join(names, "+")
}

// fastLane is whether a values set runs the fast lane (delivery.fastLane,
// true unless a file sets it).
func fastLane(t *testing.T, file string) bool {
	t.Helper()
	v := chartutil.CoalesceTables(valuesFile(t, file), loadChart(t).Values)
	on, ok := v["delivery"].(map[string]any)["fastLane"].(bool)
	if !ok {
		t.Fatalf("%s: delivery.fastLane is not a boolean", setName(file))
	}
	return on
}

func mustRender(t *testing.T, file string) []manifest {
	t.Helper()
	ms, err := render(loadChart(t), valuesFile(t, file))
	if err != nil {
		t.Fatalf("%s: render: %v", setName(file), err)
	}
	if len(ms) == 0 {
		t.Fatalf("%s: rendered nothing", setName(file))
	}
	return ms
}

// with returns base with overrides set at dotted paths ("relay.replicas").
func with(base map[string]any, overrides map[string]any) map[string]any {
	out := chartutil.Values(deepCopy(base))
	for path, v := range overrides {
		keys := strings.Split(path, ".")
		m := map[string]any(out)
		for _, k := range keys[:len(keys)-1] {
			next, ok := m[k].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[k] = next
			}
			m = next
		}
		m[keys[len(keys)-1]] = v
	}
	return out
}

func deepCopy(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if mm, ok := v.(map[string]any); ok {
			v = deepCopy(mm)
		}
		out[k] = v
	}
	return out
}

func TestMain(m *testing.M) {
	if _, err := os.Stat(filepath.Join(chartDir, "Chart.yaml")); err != nil {
		fmt.Fprintln(os.Stderr, "deploytest: run from tools/deploytest:", err)
		os.Exit(2)
	}
	code := m.Run()
	for _, d := range tempDirs {
		os.RemoveAll(d)
	}
	os.Exit(code)
}
