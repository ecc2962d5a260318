package adminapi

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"go.uber.org/goleak"

	"github.com/outboxbridge/bridge/api"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

const testToken = "s3cr3t-admin-token-for-tests"

// The OpenAPI document and its router, loaded once.
var (
	specOnce   sync.Once
	specDoc    *openapi3.T
	specRouter routers.Router
	specErr    error
)

func spec(t testing.TB) (*openapi3.T, routers.Router) {
	t.Helper()
	specOnce.Do(func() {
		loader := openapi3.NewLoader()
		specDoc, specErr = loader.LoadFromData(api.OpenAPI)
		if specErr != nil {
			return
		}
		if specErr = specDoc.Validate(context.Background()); specErr != nil {
			return
		}
		specRouter, specErr = legacy.NewRouter(specDoc)
	})
	if specErr != nil {
		t.Fatalf("api/openapi.json: %v", specErr)
	}
	return specDoc, specRouter
}

// covered records each (operationId, status) a validated response had;
// TestMain checks every documented answer but 500 was produced by a test.
var (
	coveredMu sync.Mutex
	covered   = map[string]bool{}
	sawDB     atomic.Bool
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 && sawDB.Load() && flag.Lookup("test.run").Value.String() == "" {
		if missing := uncovered(); len(missing) > 0 {
			fmt.Fprintf(os.Stderr, "documented responses no test produced (and validated):\n  %s\n", strings.Join(missing, "\n  "))
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func uncovered() []string {
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		return []string{err.Error()}
	}
	coveredMu.Lock()
	defer coveredMu.Unlock()
	var missing []string
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			for status := range op.Responses.Map() {
				if status == "500" {
					continue // a server fault: not producible by a client
				}
				if key := op.OperationID + " " + status; !covered[key] {
					missing = append(missing, key)
				}
			}
		}
	}
	sort.Strings(missing)
	return missing
}

// bundle is one test's API on its own database.
type bundle struct {
	db  *pgtest.DB
	mux *http.ServeMux
}

// setup is every test's opening: the admin API over a database of the
// test's own. The test runs in parallel (pgtest.NewParallel: no other test
// sees its rows).
func setup(t *testing.T) (*bundle, context.Context) {
	t.Helper()
	db := pgtest.NewParallel(t)
	sawDB.Store(true)
	mux := http.NewServeMux()
	if !Mount(mux, Config{Token: testToken, Pool: db.Pool, AllowHTTP: true, SecretGrace: time.Hour}) {
		t.Fatal("Mount with a token mounted nothing")
	}
	return &bundle{db: db, mux: mux}, t.Context()
}

// result is one response.
type result struct {
	Status int
	Header http.Header
	Body   []byte
}

// obj decodes the body as a JSON object.
func (r result) obj(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("body is not a JSON object: %v: %s", err, r.Body)
	}
	return m
}

// items decodes a list answer.
func (r result) items(t testing.TB) []map[string]any {
	t.Helper()
	var l struct {
		Items []map[string]any `json:"items"`
	}
	if err := json.Unmarshal(r.Body, &l); err != nil {
		t.Fatalf("body is not a list: %v: %s", err, r.Body)
	}
	return l.Items
}

// wantError asserts a JSON error answer with this status naming field.
func (r result) wantError(t testing.TB, status int, field string) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	var e struct {
		Error string `json:"error"`
		Field string `json:"field"`
	}
	if err := json.Unmarshal(r.Body, &e); err != nil || e.Error == "" {
		t.Fatalf("not a JSON error body: %s", r.Body)
	}
	if e.Field != field {
		t.Fatalf("error names field %q, want %q (%s)", e.Field, field, e.Error)
	}
}

func (r result) want(t testing.TB, status int) result {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	return r
}

// do sends a request with the right token.
func (b *bundle) do(t testing.TB, method, path, body string) result {
	t.Helper()
	return b.doAuth(t, method, path, body, "Bearer "+testToken)
}

// doAuth sends a request through the real handler and validates the
// response against api/openapi.json: a documented operation's answer with
// openapi3filter.ValidateResponse (status included), anything else (unknown
// path, wrong method) against the Error schema.
func (b *bundle) doAuth(t testing.TB, method, path, body, authorization string) result {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	// The document's server is HTTP_ADDR's default; the router matches it.
	req := httptest.NewRequest(method, "http://127.0.0.1:8080"+path, rd)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	rec := httptest.NewRecorder()
	b.mux.ServeHTTP(rec, req)
	res := result{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
	validate(t, req, res)
	return res
}

func validate(t testing.TB, req *http.Request, res result) {
	t.Helper()
	doc, router := spec(t)
	route, params, err := router.FindRoute(req)
	if err != nil {
		if res.Status != http.StatusNotFound && res.Status != http.StatusMethodNotAllowed && res.Status != http.StatusUnauthorized {
			t.Fatalf("%s %s: no documented operation, yet status %d", req.Method, req.URL.Path, res.Status)
		}
		var v any
		if err := json.Unmarshal(res.Body, &v); err != nil {
			t.Fatalf("%s %s: %d answer is not JSON: %s", req.Method, req.URL.Path, res.Status, res.Body)
		}
		if err := doc.Components.Schemas["Error"].Value.VisitJSON(v); err != nil {
			t.Fatalf("%s %s: %d answer is not an Error: %v", req.Method, req.URL.Path, res.Status, err)
		}
		return
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 res.Status,
		Header:                 res.Header,
		Body:                   io.NopCloser(bytes.NewReader(res.Body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		t.Fatalf("%s %s → %d does not match api/openapi.json: %v\nbody: %s", req.Method, req.URL.String(), res.Status, err, res.Body)
	}
	coveredMu.Lock()
	covered[fmt.Sprintf("%s %d", route.Operation.OperationID, res.Status)] = true
	coveredMu.Unlock()
}

// Fixtures --------------------------------------------------------------------

// failedRows enqueues n events on topic and parks them as FAILED, each
// payload carrying marker; it returns their ids in seq order.
func (b *bundle) failedRows(t testing.TB, topic string, n int, marker string) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := range n {
		var id string
		err := b.db.Pool.QueryRow(ctx, `SELECT bridge.enqueue($1, $2, 'asset.updated', jsonb_build_object('marker', $3::text))::text`,
			topic, fmt.Sprintf("asset-%d", i%3), marker).Scan(&id)
		if err != nil {
			t.Fatalf("enqueue: %v", err)
		}
		ids = append(ids, id)
	}
	if _, err := b.db.Pool.Exec(ctx, `UPDATE bridge.outbox SET status = 'FAILED', attempts = 10, failed_at = now(),
  last_error = 'MESSAGE_TOO_LARGE' WHERE id = ANY($1::uuid[])`, ids); err != nil {
		t.Fatalf("park rows: %v", err)
	}
	return ids
}

// createSubscription creates one through the API and returns its id.
func (b *bundle) createSubscription(t testing.TB, url string) string {
	t.Helper()
	res := b.do(t, "POST", "/api/v1/subscriptions", fmt.Sprintf(`{"url": %q, "event_types": ["asset.*"]}`, url)).want(t, http.StatusCreated)
	return res.obj(t)["id"].(string)
}

// deliveries inserts n dead deliveries for sub (payloads carry marker),
// each with one attempt; ids in insert order.
func (b *bundle) deliveries(t testing.TB, sub string, n int, marker string) []int64 {
	t.Helper()
	ctx := context.Background()
	var ids []int64
	for i := range n {
		var id int64
		err := b.db.Pool.QueryRow(ctx, `
INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, asset_seq, payload, event_created_at,
  status, attempts, dead_at, last_error, last_status_code)
VALUES ($1, $2, 'asset.updated', 'assets', $3, $4, jsonb_build_object('marker', $5::text), now(),
  'dead', 1, now(), 'HTTP 500 Internal Server Error', 500) RETURNING id`,
			sub, fmt.Sprintf("evt-%d-%d", i, time.Now().UnixNano()), nullIf(i%3 == 2, fmt.Sprintf("asset-%d", i%3)), i, marker).Scan(&id)
		if err != nil {
			t.Fatalf("insert delivery: %v", err)
		}
		if _, err := b.db.Pool.Exec(ctx, `INSERT INTO bridge.delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code, error, response_body, trace_id)
VALUES ($1, 1, now(), 12.5, 500, 'HTTP 500 Internal Server Error', 'upstream exploded', '4bf92f3577b34da6a3ce929d0e0e4736')`, id); err != nil {
			t.Fatalf("insert attempt: %v", err)
		}
		ids = append(ids, id)
	}
	return ids
}

func nullIf(null bool, s string) *string {
	if null {
		return nil
	}
	return &s
}

// walk pages through a list, returning the ids of every item and the
// number of pages; it fails on a page over limit or a runaway cursor.
func (b *bundle) walk(t testing.TB, path string, limit int) (ids []string, pages int) {
	t.Helper()
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	cursor := ""
	for {
		url := fmt.Sprintf("%s%slimit=%d", path, sep, limit)
		if cursor != "" {
			url += "&cursor=" + cursor
		}
		res := b.do(t, "GET", url, "").want(t, http.StatusOK)
		page := res.obj(t)
		items := res.items(t)
		if len(items) > limit {
			t.Fatalf("page of %d items over limit %d", len(items), limit)
		}
		pages++
		for _, it := range items {
			ids = append(ids, fmt.Sprint(it["id"]))
		}
		next, _ := page["next_cursor"].(string)
		if next == "" {
			return ids, pages
		}
		if pages > 1000 {
			t.Fatal("cursor never ends")
		}
		cursor = next
	}
}

func sameOrder(t testing.TB, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: walked %v\nwant %v", what, got, want)
	}
}
