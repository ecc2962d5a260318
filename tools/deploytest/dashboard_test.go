package deploytest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

var dashboardFile = filepath.Join(root, "deploy", "grafana", "outbox-bridge-dashboard.json")

type dashboard struct {
	Inputs []struct {
		Name     string `json:"name"`
		Type     string `json:"type"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasource     `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	// A collapsed row holds its panels.
	Panels []panel `json:"panels"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardFile, err)
	}
	return d
}

func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// grafanaVars are Grafana's built-in interval variables and the dashboard's
// own, replaced by values of their kind so the query parses as PromQL.
var grafanaVars = regexp.MustCompile(`\$(\{[A-Za-z0-9_]+(:[a-z]+)?\}|[A-Za-z0-9_]+)`)

func expandGrafana(q string) string {
	return grafanaVars.ReplaceAllStringFunc(q, func(v string) string {
		name := strings.Trim(strings.TrimPrefix(v, "$"), "{}")
		name, _, _ = strings.Cut(name, ":")
		switch name {
		case "__rate_interval", "__interval", "__range":
			return "5m"
		case "__range_s", "__interval_ms":
			return "300"
		default:
			// A template variable: in a label matcher, a regex value.
			return "x.*"
		}
	})
}

// Every panel query is valid PromQL once Grafana's variables are filled in,
// selects only metrics the bridge exports, and follows the dashboard's job
// variable; every panel uses the dashboard's data source input.
func TestDashboard(t *testing.T) {
	t.Parallel()
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard has uid %q and title %q", d.UID, d.Title)
	}
	var dsInput string
	for _, in := range d.Inputs {
		if in.Type == "datasource" && in.PluginID == "prometheus" {
			dsInput = "${" + in.Name + "}"
		}
	}
	if dsInput == "" {
		t.Fatal("no prometheus datasource in __inputs: the dashboard cannot be imported with a data source choice")
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var obj struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &obj); err != nil {
				t.Fatalf("variable %s: query %s", v.Name, v.Query)
			}
			q = obj.Query
		}
		// label_values(metric, label): the metric must be exported.
		m := regexp.MustCompile(`^label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\)$`).FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, q)
			continue
		}
		checkQuery(t, "variable "+v.Name, expandGrafana(m[1]))
	}
	ids := map[int]string{}
	queries := 0
	for _, p := range allPanels(d.Panels) {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("%s: id also used by %q", where, prev)
		}
		ids[p.ID] = p.Title
		if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 {
			t.Errorf("%s: no gridPos", where)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != dsInput {
			t.Errorf("%s: datasource %+v, want the dashboard's %s", where, p.Datasource, dsInput)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no query", where)
		}
		for _, tg := range p.Targets {
			queries++
			for _, v := range grafanaVars.FindAllString(tg.Expr, -1) {
				name := strings.Trim(strings.TrimPrefix(v, "$"), "{}")
				name, _, _ = strings.Cut(name, ":")
				if !strings.HasPrefix(name, "__") && !vars[name] {
					t.Errorf("%s: query uses $%s, which the dashboard does not define", where, name)
				}
			}
			q := expandGrafana(tg.Expr)
			checkQuery(t, where, q)
			expr, err := parser.NewParser(parser.Options{}).ParseExpr(q)
			if err != nil {
				continue // reported by checkQuery
			}
			// Choosing a job narrows every panel, not just some.
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				if vs, ok := n.(*parser.VectorSelector); ok {
					if !hasMatcher(vs.LabelMatchers, "job", labels.MatchRegexp, "x.*") {
						t.Errorf("%s: %s does not follow the job variable (job=~\"$job\")", where, vs)
					}
				}
				return nil
			})
		}
	}
	if queries == 0 {
		t.Fatal("the dashboard has no queries")
	}
}

func hasMatcher(ms []*labels.Matcher, name string, typ labels.MatchType, value string) bool {
	for _, m := range ms {
		if m.Name == name && m.Type == typ && m.Value == value {
			return true
		}
	}
	return false
}

// The Grafana variable expansion itself.
func TestExpandGrafana(t *testing.T) {
	got := expandGrafana(`sum(rate(x{job=~"$job", a="${job}"}[$__rate_interval])) + increase(y[${__range}])`)
	want := `sum(rate(x{job=~"x.*", a="x.*"}[5m])) + increase(y[5m])`
	if got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// The dashboard shows the lag of either delivery mode (the fast lane's
// bridge_fastlane_lag, what the shipped deployments run, and the row
// engine's bridge_consumer_lag) in the overview and per partition, and the
// stages' stall.
func TestDashboardCoversBothDeliveryModes(t *testing.T) {
	t.Parallel()
	d := loadDashboard(t)
	panelsUsing := map[string][]string{}
	overview := map[string]bool{}
	inOverview := false
	for _, p := range d.Panels {
		if p.Type == "row" {
			inOverview = p.Title == "Overview"
		}
		for _, sub := range allPanels([]panel{p}) {
			for _, tg := range sub.Targets {
				for _, name := range metricNames(t, sub.Title, expandGrafana(tg.Expr)) {
					panelsUsing[name] = append(panelsUsing[name], sub.Title)
					if inOverview {
						overview[name] = true
					}
				}
			}
		}
	}
	for _, lag := range []string{"bridge_fastlane_lag", "bridge_consumer_lag"} {
		if len(panelsUsing[lag]) < 2 || !overview[lag] {
			t.Errorf("%s is in panels %v (overview: %v), want the overview and a panel by partition", lag, panelsUsing[lag], overview[lag])
		}
	}
	if len(panelsUsing["bridge_stage_stalled_seconds"]) == 0 {
		t.Error("no panel shows bridge_stage_stalled_seconds (BridgeStageStalled's series)")
	}
}
