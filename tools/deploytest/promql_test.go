package deploytest

import (
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

// checkQuery parses q as PromQL and checks that every metric it selects is
// one the bridge exports (exportedMetric).
func checkQuery(t *testing.T, where, q string) {
	t.Helper()
	for _, name := range metricNames(t, where, q) {
		if !exportedMetric(t, name) {
			t.Errorf("%s: %s is not a metric the bridge exports (query %s)", where, name, q)
		}
	}
}

// metricNames are the metric names q selects.
func metricNames(t *testing.T, where, q string) []string {
	t.Helper()
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(q)
	if err != nil {
		t.Errorf("%s: %q is not valid PromQL: %v", where, q, err)
		return nil
	}
	var names []string
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			if name == "" {
				for _, m := range vs.LabelMatchers {
					if m.Name == "__name__" {
						name = m.Value
					}
				}
			}
			if name == "" {
				t.Errorf("%s: %q selects series without naming a metric", where, q)
			}
			names = append(names, name)
		}
		return nil
	})
	return names
}
