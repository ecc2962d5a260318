package deploytest

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

var (
	rulesFile     = filepath.Join(root, "deploy", "prometheus", "outbox-bridge-alerts.yaml")
	rulesTestFile = filepath.Join(root, "deploy", "prometheus", "outbox-bridge-alerts.test.yaml")
)

var (
	promtoolOnce sync.Once
	promtoolPath string
	promtoolErr  error
)

// promtool is Prometheus's promtool at the version in go.mod (the tool
// directive), built without the service-discovery plugins, which rules do
// not need and which are most of its build (remove_all_sd).
func promtool(t *testing.T) string {
	t.Helper()
	promtoolOnce.Do(func() {
		promtoolPath, promtoolErr = cachedBinary(".", "-tags", "remove_all_sd", "github.com/prometheus/prometheus/cmd/promtool")
	})
	if promtoolErr != nil {
		t.Fatal(promtoolErr)
	}
	return promtoolPath
}

func runPromtool(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestPromtoolCheckRules(t *testing.T) {
	t.Parallel()
	out := runPromtool(t, "check", "rules", "--lint=all", "--lint-fatal", rulesFile)
	t.Log(out)
}

func TestPromtoolTestRules(t *testing.T) {
	t.Parallel()
	out := runPromtool(t, "test", "rules", rulesTestFile)
	t.Log(out)
}

func parseRules() (*rulefmt.RuleGroups, []error) {
	return rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
}

type ruleTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name          string `json:"name"`
		AlertRuleTest []struct {
			EvalTime  string `json:"eval_time"`
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// Every alert has a unit test where it fires and one where it must not;
// one with `for` is also checked one evaluation before its duration (still
// pending, so not in exp_alerts) — the test file's comments say at which.
func TestEveryAlertIsUnitTested(t *testing.T) {
	groups, errs := parseRules()
	for _, err := range errs {
		t.Errorf("%s: %v", rulesFile, err)
	}
	if groups == nil {
		t.FailNow()
	}
	raw, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var tests ruleTests
	// Not strict: this struct has only the fields checked here (promtool
	// itself rejects unknown ones).
	if err := yaml.Unmarshal(raw, &tests); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tests.RuleFiles, []string{filepath.Base(rulesFile)}) {
		t.Errorf("the unit tests load %v, want [%s]", tests.RuleFiles, filepath.Base(rulesFile))
	}
	fires := map[string]int{}
	silent := map[string]int{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname]++
			} else {
				silent[a.Alertname]++
			}
		}
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if fires[r.Alert] == 0 {
				t.Errorf("alert %s has no test where it fires", r.Alert)
			}
			// With `for`: the pending evaluation before it fires, and a
			// series that must not fire it at all.
			want := 1
			if r.For != 0 {
				want = 2
			}
			if silent[r.Alert] < want {
				t.Errorf("alert %s (for %v) has %d evaluations where it must not fire, want at least %d", r.Alert, r.For, silent[r.Alert], want)
			}
			delete(fires, r.Alert)
			delete(silent, r.Alert)
		}
	}
	for name := range fires {
		t.Errorf("the unit tests expect alert %s, which the rules do not define", name)
	}
	for name := range silent {
		t.Errorf("the unit tests name alert %s, which the rules do not define", name)
	}
}

// The rules select only metrics the bridge exports (and Prometheus's own up).
func TestAlertMetricsExported(t *testing.T) {
	t.Parallel()
	groups, errs := parseRules()
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			checkQuery(t, "alert "+r.Alert, r.Expr)
		}
	}
}

// Each delivery mode's lag has its alert, and each says which mode it
// applies to: the fast lane's (WEBHOOK_FAST_LANE=true, the shipped
// deployments) and the row engine's consumer (WEBHOOK_FAST_LANE=false).
func TestAlertsCoverBothDeliveryModes(t *testing.T) {
	t.Parallel()
	groups, errs := parseRules()
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	want := map[string]string{
		"bridge_fastlane_lag": "WEBHOOK_FAST_LANE=true",
		"bridge_consumer_lag": "WEBHOOK_FAST_LANE=false",
	}
	found := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			for _, name := range metricNames(t, r.Alert, r.Expr) {
				mode, ok := want[name]
				if !ok {
					continue
				}
				found[name] = true
				if !strings.Contains(r.Annotations["description"], mode) {
					t.Errorf("alert %s on %s: its description does not say it applies with %s", r.Alert, name, mode)
				}
			}
		}
	}
	for name := range want {
		if !found[name] {
			t.Errorf("no alert on %s", name)
		}
	}
}
