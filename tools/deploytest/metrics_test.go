package deploytest

import (
	"bytes"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrapeGenerated are series Prometheus itself adds to every target; no
// process exports them.
var scrapeGenerated = map[string]bool{"up": true, "scrape_duration_seconds": true, "scrape_samples_scraped": true}

// exportedMetrics is the set of metric names the bridge exports: the names
// on /metrics of a running `bridge run` that has carried one event from the
// outbox to a webhook, plus those declared in internal/metrics that only
// appear after their first event of a kind the run did not provoke
// (attempts charged, parks, dead deliveries, refresh errors). The second
// set is read from the instrument registrations (registeredMetrics), and
// which names came only from there is logged.
type exportedMetrics struct {
	scraped    map[string]bool
	registered map[string]bool
	err        error
}

var (
	exportedOnce sync.Once
	exported     exportedMetrics
)

func exportedMetric(t *testing.T, name string) bool {
	t.Helper()
	exportedOnce.Do(func() {
		exported.registered, exported.err = registeredMetrics(filepath.Join(root, "internal", "metrics"))
		// Both delivery paths: the fast lane (the default) exports the
		// bridge_fastlane_* series, the row engine the consumer's.
		exported.scraped = map[string]bool{}
		for _, fastLane := range []bool{true, false} {
			if exported.err != nil {
				break
			}
			var names map[string]bool
			names, exported.err = scrapeRunningBridge(t, fastLane)
			maps.Copy(exported.scraped, names)
		}
	})
	if exported.err != nil {
		unavailable(t, exported.err)
	}
	if scrapeGenerated[name] || exported.scraped[name] {
		return true
	}
	if exported.registered[name] {
		t.Logf("%s is not on /metrics before its first event; its registration in internal/metrics declares it", name)
		return true
	}
	return false
}

// unavailable fails under CI=true (a missing service must not pass) and
// skips otherwise.
func unavailable(t *testing.T, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(err)
	}
	t.Skipf("%v (skipping: CI is not true)", err)
}

// registeredMetrics reads the instrument registrations in dir (calls like
// meter.Int64Counter("bridge.relay.produced", …, metric.WithUnit("{row}")))
// and returns the Prometheus names the exporter gives them: dots become
// underscores, the unit a suffix (s → _seconds), counters get _total,
// histograms their _bucket, _sum and _count series.
func registeredMetrics(dir string) (map[string]bool, error) {
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			return nil, err
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			name, ok := stringLit(call.Args[0])
			if !ok || !strings.HasPrefix(name, "bridge.") {
				return true
			}
			var kind, unit string
			switch fn := call.Fun.(type) {
			case *ast.SelectorExpr:
				kind = fn.Sel.Name
			case *ast.Ident:
				// A local helper (consumer.go's counter(name, desc, unit)).
				kind = fn.Name
				if len(call.Args) == 3 {
					unit, _ = stringLit(call.Args[2])
				}
			}
			for _, a := range call.Args[1:] {
				if c, ok := a.(*ast.CallExpr); ok {
					if sel, ok := c.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "WithUnit" && len(c.Args) == 1 {
						unit, _ = stringLit(c.Args[0])
					}
				}
			}
			base := strings.ReplaceAll(name, ".", "_")
			switch unit {
			case "s":
				base += "_seconds"
			case "By":
				base += "_bytes"
			case "ms":
				base += "_milliseconds"
			}
			lower := strings.ToLower(kind)
			switch {
			case strings.Contains(lower, "histogram"):
				for _, s := range []string{"", "_bucket", "_sum", "_count"} {
					out[base+s] = true
				}
			case strings.Contains(lower, "counter"):
				out[base+"_total"] = true
			case strings.Contains(lower, "gauge"):
				out[base] = true
			}
			return true
		})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no instrument registrations found in %s", dir)
	}
	return out, nil
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// The registration reader finds what internal/metrics declares (a check of
// the checker: a name it cannot see would be reported as not exported).
func TestRegisteredMetrics(t *testing.T) {
	got, err := registeredMetrics(filepath.Join(root, "internal", "metrics"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{
		"bridge_relay_produced_total", "bridge_relay_produce_latency_seconds_bucket", "bridge_relay_outage",
		"bridge_outbox_oldest_new_age_seconds", "bridge_outbox_rows", "bridge_consumer_lag",
		"bridge_consumer_records_total", "bridge_delivery_attempts_total", "bridge_deliveries",
		"bridge_delivery_oldest_pending_age_seconds", "bridge_metrics_refresh_errors_total",
	} {
		if !got[name] {
			t.Errorf("registeredMetrics misses %s", name)
		}
	}
}

const defaultDatabaseURL = "postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable"

// scrapeRunningBridge builds the bridge, runs `bridge run` (the fast lane or
// the row engine) against a
// database of its own on the test PostgreSQL and the test Kafka, carries one
// event from the outbox to a webhook receiver, and returns the metric names
// on its /metrics.
func scrapeRunningBridge(t *testing.T, fastLane bool) (map[string]bool, error) {
	// Built before the clock starts: on a cold build cache on a busy
	// machine the build alone can take minutes.
	bin, err := cachedBinary(root, "./cmd/bridge")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	adminURL := os.Getenv("DATABASE_URL")
	if adminURL == "" {
		adminURL = defaultDatabaseURL
	}
	brokers := os.Getenv("KAFKA_BROKERS")
	if brokers == "" {
		brokers = "127.0.0.1:9092"
	}
	if c, err := net.DialTimeout("tcp", strings.Split(brokers, ",")[0], 3*time.Second); err != nil {
		return nil, fmt.Errorf("kafka at %s is not reachable (%v); start it with make services", brokers, err)
	} else {
		c.Close()
	}
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, fmt.Errorf("postgresql at DATABASE_URL is not reachable (%v); start it with make services", err)
	}
	defer admin.Close(context.Background())
	suffix := fmt.Sprintf("%d_%d", os.Getpid(), time.Now().UnixNano())
	dbName := "deploytest_" + suffix
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{dbName}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		admin.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{dbName}.Sanitize()+" WITH (FORCE)") //nolint:errcheck
	}()
	dbURL, err := withDatabase(adminURL, dbName)
	if err != nil {
		return nil, err
	}

	topic := "deploytest-" + strings.ReplaceAll(suffix, "_", "-")
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	const token = "deploytest-admin-token-0123456789"
	env := append(os.Environ(),
		"DATABASE_URL="+dbURL,
		"KAFKA_BROKERS="+brokers,
		"CONSUMER_TOPICS="+topic,
		"CONSUMER_GROUP="+topic,
		"HTTP_ADDR="+addr,
		"ADMIN_TOKEN="+token,
		// The key ring that seals the signing secrets (a test key).
		"BRIDGE_SECRET_KEYS=deploytest:ZGVwbG95dGVzdC1rZXktdGhpcnR5LXR3by1ieXRlcyE=",
		"WEBHOOK_ALLOW_HTTP=true",
		"WEBHOOK_ALLOWED_CIDRS=127.0.0.0/8",
		"OTEL_SDK_DISABLED=true",
		"OTEL_METRICS_EXPORTER=none",
		"LOG_LEVEL=warn",
		"WEBHOOK_FAST_LANE="+strconv.FormatBool(fastLane),
	)
	migrate := exec.CommandContext(ctx, bin, "migrate")
	migrate.Env = env
	if out, err := migrate.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("bridge migrate: %v\n%s", err, out)
	}

	var logs bytes.Buffer
	run := exec.Command(bin, "run")
	run.Env = env
	run.Stdout, run.Stderr = &logs, &logs
	if err := run.Start(); err != nil {
		return nil, err
	}
	defer func() {
		run.Process.Signal(os.Interrupt) //nolint:errcheck
		done := make(chan struct{})
		go func() { run.Wait(); close(done) }() //nolint:errcheck
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			run.Process.Kill() //nolint:errcheck
			<-done
		}
	}()
	fail := func(err error) (map[string]bool, error) {
		return nil, fmt.Errorf("%w\nbridge run's output:\n%s", err, logs.String())
	}
	base := "http://" + addr
	if err := waitFor(ctx, func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}); err != nil {
		return fail(fmt.Errorf("bridge run never became ready: %w", err))
	}

	// A receiver and its subscription, then one event.
	received := make(chan struct{}, 16)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck
		w.WriteHeader(http.StatusNoContent)
		select {
		case received <- struct{}{}:
		default:
		}
	}))
	defer recv.Close()
	body := fmt.Sprintf(`{"url": %q, "event_types": ["*"], "topic": %q}`, recv.URL+"/hook", topic)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/subscriptions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fail(err)
	}
	rb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fail(fmt.Errorf("create subscription: %s: %s", resp.Status, rb))
	}
	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fail(err)
	}
	defer db.Close(context.Background())
	if _, err := db.Exec(ctx, `SELECT bridge.enqueue($1, 'asset-1', 'asset.updated', '{"v": 1}')`, topic); err != nil {
		return fail(fmt.Errorf("enqueue: %w", err))
	}
	select {
	case <-received:
	case <-ctx.Done():
		return fail(fmt.Errorf("the webhook never arrived: %w", ctx.Err()))
	}

	// The attempt's counter and the lag (the consumer's is read from Kafka
	// at most every 10 s; the fast lane's from its memory) are on /metrics a
	// little after the webhook arrived.
	lag := "bridge_consumer_lag"
	if fastLane {
		lag = "bridge_fastlane_lag"
	}
	var names map[string]bool
	if err := waitFor(ctx, func() bool {
		names, err = scrape(base + "/metrics")
		return err == nil && names["bridge_delivery_attempts_total"] && names[lag]
	}); err != nil {
		if err == nil {
			err = ctx.Err()
		}
		return fail(fmt.Errorf("/metrics never showed the delivery and the lag (has %v): %w", sortedKeys(names), err))
	}
	return names, nil
}

func scrape(url string) (map[string]bool, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse /metrics: %w", err)
	}
	out := map[string]bool{}
	for name, f := range fams {
		if len(f.Metric) == 0 {
			continue
		}
		out[name] = true
		switch f.GetType().String() {
		case "HISTOGRAM":
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[name+s] = true
			}
		case "SUMMARY":
			out[name+"_sum"], out[name+"_count"] = true, true
		}
	}
	return out, nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func waitFor(ctx context.Context, cond func() bool) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// withDatabase returns the URL u pointing at database name instead.
func withDatabase(u, name string) (string, error) {
	parsed, err := url.Parse(u)
	if err != nil || (parsed.Scheme != "postgres" && parsed.Scheme != "postgresql") {
		return "", fmt.Errorf("DATABASE_URL must be a postgres:// URL here (%v)", err)
	}
	parsed.Path = "/" + name
	return parsed.String(), nil
}
