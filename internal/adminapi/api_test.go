package adminapi

import (
	"bytes"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxbridge/bridge/api"
	"github.com/outboxbridge/bridge/internal/opsserver"
)

// The route table and the OpenAPI document describe the same endpoints.
func TestRoutesMatchOpenAPI(t *testing.T) {
	t.Parallel()
	doc, _ := spec(t)
	var documented []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	served := []string{"GET /openapi.json"}
	for _, r := range (&adminAPI{}).routeTable() {
		served = append(served, r.pattern)
	}
	sort.Strings(documented)
	sort.Strings(served)
	if !slices.Equal(documented, served) {
		t.Fatalf("api/openapi.json documents\n  %s\nthe API serves\n  %s", strings.Join(documented, "\n  "), strings.Join(served, "\n  "))
	}
}

func TestOpenAPIServed(t *testing.T) {
	b, _ := setup(t)
	res := b.doAuth(t, "GET", "/openapi.json", "", "").want(t, http.StatusOK)
	if !bytes.Equal(res.Body, api.OpenAPI) {
		t.Fatal("GET /openapi.json differs from api/openapi.json")
	}
}

// Without ADMIN_TOKEN nothing is mounted: the ops server answers health and
// metrics, and 404 on the API's paths.
func TestNotMountedWithoutToken(t *testing.T) {
	t.Parallel()
	ops := opsserver.New(opsserver.Config{Metrics: http.NotFoundHandler()})
	if Mount(ops, Config{Token: ""}) {
		t.Fatal("Mount without a token reported the API mounted")
	}
	if Mount(nil, Config{Token: testToken}) {
		t.Fatal("Mount on no server reported the API mounted")
	}
	if Mount(ops, Config{Token: "   "}) {
		t.Fatal("Mount with a blank token reported the API mounted")
	}
	for path, want := range map[string]int{
		"/healthz": 200, "/api/v1/outbox/stats": 404, "/api/v1/subscriptions": 404, "/openapi.json": 404,
	} {
		req := httptest.NewRequest("GET", path, nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		rec := httptest.NewRecorder()
		ops.Handler().ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("GET %s: %d, want %d", path, rec.Code, want)
		}
	}
}

// Every operation answers 401 to a missing or wrong token, before it looks
// at its input; the right token gets through.
func TestAuth(t *testing.T) {
	b, _ := setup(t)
	doc, _ := spec(t)
	bad := []string{
		"",                                       // no header
		"Bearer",                                 // no token
		"Bearer ",                                // empty token
		"Bearer wrong",                           // wrong token
		"Bearer " + testToken + "x",              // right prefix
		"Bearer " + testToken[:len(testToken)-1], // a prefix of the right one
		"Basic " + testToken,                     // wrong scheme
		testToken,                                // no scheme
	}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if path == "/openapi.json" {
				continue
			}
			concrete := strings.NewReplacer("{id}", "1").Replace(path)
			for _, auth := range bad {
				res := b.doAuth(t, method, concrete, `{}`, auth)
				res.wantError(t, http.StatusUnauthorized, "Authorization")
				if !strings.HasPrefix(res.Header.Get("WWW-Authenticate"), "Bearer") {
					t.Fatalf("%s %s: 401 without WWW-Authenticate: Bearer", method, concrete)
				}
			}
		}
	}
	// Unknown paths answer 401 too: no probing the API without the token.
	b.doAuth(t, "GET", "/api/v1/nope", "", "").wantError(t, http.StatusUnauthorized, "Authorization")
	// The scheme is case-insensitive (RFC 9110); the token is not.
	b.doAuth(t, "GET", "/api/v1/outbox/stats", "", "bearer "+testToken).want(t, http.StatusOK)
	b.doAuth(t, "GET", "/api/v1/outbox/stats", "", "Bearer "+strings.ToUpper(testToken)).want(t, http.StatusUnauthorized)
}

// The token comparison is crypto/subtle's constant-time compare over
// digests, and the raw token is not kept: read from the source, since
// timing cannot be asserted reliably in a unit test.
func TestTokenComparedInConstantTime(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "api.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var authorized *ast.FuncDecl
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == "tokenMatches" {
			authorized = fd
		}
	}
	if authorized == nil {
		t.Fatal("no tokenMatches function in api.go")
	}
	var constantTime bool
	ast.Inspect(authorized.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if id, ok := n.X.(*ast.Ident); ok && id.Name == "subtle" && n.Sel.Name == "ConstantTimeCompare" {
				constantTime = true
			}
		case *ast.BinaryExpr:
			if n.Op == token.EQL || n.Op == token.NEQ {
				if _, lit := n.Y.(*ast.BasicLit); !lit {
					t.Errorf("tokenMatches compares with %s at %s: use subtle.ConstantTimeCompare", n.Op, fset.Position(n.Pos()))
				}
			}
		}
		return true
	})
	if !constantTime {
		t.Error("tokenMatches does not call subtle.ConstantTimeCompare")
	}
	typ := reflect.TypeFor[adminAPI]()
	for i := range typ.NumField() {
		if typ.Field(i).Type.Kind() == reflect.String {
			t.Errorf("adminAPI keeps a string field %s: the token must be kept only as its digest", typ.Field(i).Name)
		}
	}
	a := newAPI(Config{Token: testToken})
	if bytes.Contains(a.tokenDigest[:], []byte(testToken)) {
		t.Error("tokenDigest holds the token")
	}
}

func TestOutboxEndpoints(t *testing.T) {
	b, ctx := setup(t)
	ids := b.failedRows(t, "assets", 3, "payload-marker-outbox")
	other := b.failedRows(t, "orders", 2, "payload-marker-outbox")

	st := b.do(t, "GET", "/api/v1/outbox/stats", "").want(t, http.StatusOK).obj(t)
	if got := st["by_status"].(map[string]any)["FAILED"]; got != float64(5) {
		t.Fatalf("stats FAILED = %v, want 5", got)
	}
	if got := st["failed_by_topic"].(map[string]any)["orders"]; got != float64(2) {
		t.Fatalf("stats failed_by_topic[orders] = %v, want 2", got)
	}

	res := b.do(t, "GET", "/api/v1/outbox/failed?topic=orders", "").want(t, http.StatusOK)
	items := res.items(t)
	if len(items) != 2 || items[0]["id"] != other[0] || items[1]["id"] != other[1] {
		t.Fatalf("failed?topic=orders = %v, want %v", items, other)
	}
	if items[0]["last_error"] != "MESSAGE_TOO_LARGE" || items[0]["attempts"] != float64(10) {
		t.Fatalf("failed row lacks its attempts or last error: %v", items[0])
	}

	// Replay by id: only that row returns to NEW; an id that does not
	// exist is named with the reason.
	res = b.do(t, "POST", "/api/v1/outbox/replay", fmt.Sprintf(`{"ids": [%q, "00000000-0000-4000-8000-000000000000"]}`, ids[0])).want(t, http.StatusOK)
	if n := res.obj(t)["replayed"]; n != float64(1) {
		t.Fatalf("replayed %v, want 1", n)
	}
	if nr, _ := res.obj(t)["not_replayed"].([]any); len(nr) != 1 || nr[0].(map[string]any)["id"] != "00000000-0000-4000-8000-000000000000" ||
		nr[0].(map[string]any)["reason"] != "no such outbox row" {
		t.Fatalf("not_replayed = %v, want the unknown id with its reason", res.obj(t)["not_replayed"])
	}
	// Again: now NEW, so not FAILED.
	res = b.do(t, "POST", "/api/v1/outbox/replay", fmt.Sprintf(`{"ids": [%q]}`, ids[0])).want(t, http.StatusOK)
	if nr, _ := res.obj(t)["not_replayed"].([]any); res.obj(t)["replayed"] != float64(0) || len(nr) != 1 || nr[0].(map[string]any)["reason"] != "is NEW, not FAILED" {
		t.Fatalf("second replay = %s", res.Body)
	}
	var status string
	var attempts int
	if err := b.db.Pool.QueryRow(ctx, `SELECT status, attempts FROM bridge.outbox WHERE id = $1`, ids[0]).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != "NEW" || attempts != 0 {
		t.Fatalf("replayed row is %s with %d attempts, want NEW with 0", status, attempts)
	}

	// Replay all of one topic within a window.
	res = b.do(t, "POST", "/api/v1/outbox/replay", `{"all_failed": true, "topic": "orders", "since": "1h"}`).want(t, http.StatusOK)
	if n := res.obj(t)["replayed"]; n != float64(2) {
		t.Fatalf("replayed %v, want 2", n)
	}
	var failed int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.outbox WHERE status = 'FAILED'`).Scan(&failed); err != nil {
		t.Fatal(err)
	}
	if failed != 2 {
		t.Fatalf("%d rows still FAILED, want 2 (assets rows not replayed)", failed)
	}
	res = b.do(t, "POST", "/api/v1/outbox/replay", `{"all_failed": true}`).want(t, http.StatusOK)
	if n := res.obj(t)["replayed"]; n != float64(2) {
		t.Fatalf("replayed %v, want 2", n)
	}
}

func TestSubscriptionLifecycle(t *testing.T) {
	b, _ := setup(t)
	res := b.do(t, "POST", "/api/v1/subscriptions",
		`{"url": "https://crm.example.com/hooks", "event_types": ["asset.*", "order.paid"], "topic": "assets", "description": "CRM"}`).want(t, http.StatusCreated)
	created := res.obj(t)
	id := created["id"].(string)
	if res.Header.Get("Location") != "/api/v1/subscriptions/"+id {
		t.Fatalf("Location %q", res.Header.Get("Location"))
	}
	if created["topic"] != "assets" || created["description"] != "CRM" || created["enabled"] != true {
		t.Fatalf("created %v", created)
	}

	got := b.do(t, "GET", "/api/v1/subscriptions/"+id, "").want(t, http.StatusOK).obj(t)
	if got["url"] != "https://crm.example.com/hooks" || len(got["secrets"].([]any)) != 1 {
		t.Fatalf("get %v", got)
	}

	upd := b.do(t, "PATCH", "/api/v1/subscriptions/"+id, `{"url": "https://crm.example.com/v2/hooks", "topic": ""}`).want(t, http.StatusOK).obj(t)
	if upd["url"] != "https://crm.example.com/v2/hooks" || upd["topic"] != nil || upd["description"] != "CRM" {
		t.Fatalf("update changed the wrong fields: %v", upd)
	}
	if et := upd["event_types"].([]any); len(et) != 2 {
		t.Fatalf("update without event_types changed them: %v", et)
	}
	rl := b.do(t, "PATCH", "/api/v1/subscriptions/"+id, `{"rate_limit": 20, "rate_burst": 5}`).want(t, http.StatusOK).obj(t)
	if rl["rate_limit"] != 20.0 || rl["rate_burst"] != 5.0 || rl["url"] != "https://crm.example.com/v2/hooks" {
		t.Fatalf("rate limit update: %v; want rate_limit 20, rate_burst 5, the rest unchanged", rl)
	}
	if rl = b.do(t, "PATCH", "/api/v1/subscriptions/"+id, `{"rate_limit": 0}`).want(t, http.StatusOK).obj(t); rl["rate_limit"] != nil {
		t.Fatalf("rate_limit 0 left %v; want no limit (field absent)", rl["rate_limit"])
	}

	dis := b.do(t, "POST", "/api/v1/subscriptions/"+id+"/disable", `{"reason": "endpoint migrating"}`).want(t, http.StatusOK).obj(t)
	if dis["enabled"] != false || dis["disabled_reason"] != "endpoint migrating" {
		t.Fatalf("disable %v", dis)
	}
	dis = b.do(t, "POST", "/api/v1/subscriptions/"+id+"/disable", "").want(t, http.StatusOK).obj(t)
	if dis["disabled_reason"] != "disabled by an operator" {
		t.Fatalf("disable without a body: %v", dis)
	}
	en := b.do(t, "POST", "/api/v1/subscriptions/"+id+"/enable", "").want(t, http.StatusOK).obj(t)
	if en["enabled"] != true || en["consecutive_failures"] != float64(0) {
		t.Fatalf("enable %v", en)
	}

	b.do(t, "DELETE", "/api/v1/subscriptions/"+id, "").want(t, http.StatusNoContent)
	b.do(t, "GET", "/api/v1/subscriptions/"+id, "").wantError(t, http.StatusNotFound, "id")
	missing := "/api/v1/subscriptions/" + id
	b.do(t, "DELETE", missing, "").wantError(t, http.StatusNotFound, "id")
	b.do(t, "PATCH", missing, `{"description": "x"}`).wantError(t, http.StatusNotFound, "id")
	b.do(t, "POST", missing+"/rotate-secret", "").wantError(t, http.StatusNotFound, "id")
	b.do(t, "POST", missing+"/enable", "").wantError(t, http.StatusNotFound, "id")
	b.do(t, "POST", missing+"/disable", "").wantError(t, http.StatusNotFound, "id")
}

// The secret appears in the answers to create and rotate-secret and in no
// other answer, not even as metadata's neighbour.
func TestSecretsOnlyOnCreateAndRotate(t *testing.T) {
	b, _ := setup(t)
	res := b.do(t, "POST", "/api/v1/subscriptions", `{"url": "https://a.example.com/h", "event_types": ["*"]}`).want(t, http.StatusCreated)
	first, _ := res.obj(t)["secret"].(string)
	if !strings.HasPrefix(first, "whsec_") {
		t.Fatalf("create answer has no secret: %s", res.Body)
	}
	id := res.obj(t)["id"].(string)
	res = b.do(t, "POST", "/api/v1/subscriptions/"+id+"/rotate-secret", "").want(t, http.StatusOK)
	second, _ := res.obj(t)["secret"].(string)
	if !strings.HasPrefix(second, "whsec_") || second == first {
		t.Fatalf("rotate answer has no new secret: %s", res.Body)
	}
	if n := len(res.obj(t)["secrets"].([]any)); n != 2 {
		t.Fatalf("after rotation %d secrets listed, want 2 (old one in its grace)", n)
	}
	b.createSubscription(t, "https://b.example.com/h")

	for _, r := range []result{
		b.do(t, "GET", "/api/v1/subscriptions", ""),
		b.do(t, "GET", "/api/v1/subscriptions?limit=1", ""),
		b.do(t, "GET", "/api/v1/subscriptions/"+id, ""),
		b.do(t, "PATCH", "/api/v1/subscriptions/"+id, `{"description": "d"}`),
		b.do(t, "POST", "/api/v1/subscriptions/"+id+"/disable", ""),
		b.do(t, "POST", "/api/v1/subscriptions/"+id+"/enable", ""),
	} {
		if r.Status != http.StatusOK {
			t.Fatalf("status %d: %s", r.Status, r.Body)
		}
		body := string(r.Body)
		if strings.Contains(body, first) || strings.Contains(body, second) || strings.Contains(body, "whsec_") || strings.Contains(body, `"secret"`) {
			t.Fatalf("a secret leaked: %s", body)
		}
	}
}

// The delivery log and the FAILED listing never carry payloads.
func TestPayloadsNeverReturned(t *testing.T) {
	b, _ := setup(t)
	const marker = "payload-marker-7f3a"
	sub := b.createSubscription(t, "https://a.example.com/h")
	ids := b.deliveries(t, sub, 3, marker)
	b.failedRows(t, "assets", 2, marker)
	one := strconv.FormatInt(ids[0], 10)
	for _, r := range []result{
		b.do(t, "GET", "/api/v1/deliveries", ""),
		b.do(t, "GET", "/api/v1/deliveries?subscription="+sub+"&status=dead&asset=asset-0", ""),
		b.do(t, "GET", "/api/v1/deliveries/"+one, ""),
		b.do(t, "GET", "/api/v1/deliveries/"+one+"/attempts", ""),
		b.do(t, "GET", "/api/v1/outbox/failed", ""),
	} {
		if r.Status != http.StatusOK {
			t.Fatalf("status %d: %s", r.Status, r.Body)
		}
		if strings.Contains(string(r.Body), marker) || strings.Contains(string(r.Body), `"payload"`) {
			t.Fatalf("a payload leaked: %s", r.Body)
		}
	}
	if n := len(b.do(t, "GET", "/api/v1/deliveries/"+one+"/attempts", "").items(t)); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
}

func TestDeliveriesEndpoints(t *testing.T) {
	b, ctx := setup(t)
	sub := b.createSubscription(t, "https://a.example.com/h")
	other := b.createSubscription(t, "https://b.example.com/h")
	ids := b.deliveries(t, sub, 6, "m")
	otherIDs := b.deliveries(t, other, 2, "m")

	// Filters: subscription, asset (and the null asset with asset=).
	got, _ := b.walk(t, "/api/v1/deliveries?subscription="+sub+"&asset=asset-1", 10)
	sameOrder(t, "asset-1", got, []string{fmt.Sprint(ids[4]), fmt.Sprint(ids[1])})
	got, _ = b.walk(t, "/api/v1/deliveries?subscription="+sub+"&asset=", 10)
	sameOrder(t, "null asset", got, []string{fmt.Sprint(ids[5]), fmt.Sprint(ids[2])})
	got, _ = b.walk(t, "/api/v1/deliveries?status=delivered", 10)
	if len(got) != 0 {
		t.Fatalf("status=delivered listed %v", got)
	}
	d := b.do(t, "GET", "/api/v1/deliveries/"+fmt.Sprint(ids[0]), "").want(t, http.StatusOK).obj(t)
	if d["status"] != "dead" || d["subscription_id"] != sub {
		t.Fatalf("delivery %v", d)
	}
	b.do(t, "GET", "/api/v1/deliveries/999999999", "").wantError(t, http.StatusNotFound, "id")
	b.do(t, "GET", "/api/v1/deliveries/999999999/attempts", "").wantError(t, http.StatusNotFound, "id")

	// Revive by ids: only those; by subscription: the rest of it.
	res := b.do(t, "POST", "/api/v1/deliveries/revive", fmt.Sprintf(`{"ids": [%d, %d]}`, ids[0], ids[1])).want(t, http.StatusOK)
	if rv := res.obj(t)["revived"].([]any); len(rv) != 2 {
		t.Fatalf("revived %v", rv)
	}
	if _, ok := res.obj(t)["not_revived"]; ok {
		t.Fatalf("not_revived present when every id was revived: %s", res.Body)
	}
	// Ids not revived are named with the reason: not dead, or no such one.
	res = b.do(t, "POST", "/api/v1/deliveries/revive", fmt.Sprintf(`{"ids": [%d, 999999999]}`, ids[0])).want(t, http.StatusOK)
	want := []any{map[string]any{"id": float64(ids[0]), "reason": "is pending, not dead"}, map[string]any{"id": float64(999999999), "reason": "no such delivery"}}
	if rv := res.obj(t)["revived"].([]any); len(rv) != 0 || fmt.Sprint(res.obj(t)["not_revived"]) != fmt.Sprint(want) {
		t.Fatalf("revive of ids not dead = %s, want not_revived %v", res.Body, want)
	}
	res = b.do(t, "POST", "/api/v1/deliveries/revive", fmt.Sprintf(`{"subscription_id": %q, "dead": true}`, sub)).want(t, http.StatusOK)
	if rv := res.obj(t)["revived"].([]any); len(rv) != 4 {
		t.Fatalf("revived %v, want the other 4", rv)
	}
	var dead int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries WHERE status = 'dead'`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != len(otherIDs) {
		t.Fatalf("%d dead deliveries left, want %d (the other subscription's)", dead, len(otherIDs))
	}
	b.do(t, "POST", "/api/v1/deliveries/revive", `{"subscription_id": "00000000-0000-4000-8000-000000000000", "dead": true}`).
		wantError(t, http.StatusNotFound, "subscription_id")
}

// Walking every list a page at a time yields each row exactly once, in the
// list's order, also when rows are added or removed between pages.
func TestCursorPagination(t *testing.T) {
	b, _ := setup(t)

	failed := b.failedRows(t, "assets", 7, "m")
	got, pages := b.walk(t, "/api/v1/outbox/failed", 3)
	sameOrder(t, "outbox/failed", got, failed)
	if pages != 3 {
		t.Fatalf("7 rows at 3 a page took %d pages", pages)
	}
	got, pages = b.walk(t, "/api/v1/outbox/failed", 7)
	if sameOrder(t, "outbox/failed, one full page", got, failed); pages != 1 {
		t.Fatalf("7 rows at 7 a page took %d pages, want 1 (no empty trailing page)", pages)
	}

	var subs []string
	for i := range 5 {
		subs = append(subs, b.createSubscription(t, fmt.Sprintf("https://s%d.example.com/h", i)))
	}
	got, _ = b.walk(t, "/api/v1/subscriptions", 2)
	sameOrder(t, "subscriptions", got, subs)

	// Rows removed behind the cursor and added ahead of it.
	res := b.do(t, "GET", "/api/v1/subscriptions?limit=2", "").want(t, http.StatusOK)
	cursor := res.obj(t)["next_cursor"].(string)
	b.do(t, "DELETE", "/api/v1/subscriptions/"+subs[1], "").want(t, http.StatusNoContent)
	late := b.createSubscription(t, "https://late.example.com/h")
	var rest []string
	for cursor != "" {
		res = b.do(t, "GET", "/api/v1/subscriptions?limit=2&cursor="+cursor, "").want(t, http.StatusOK)
		for _, it := range res.items(t) {
			rest = append(rest, it["id"].(string))
		}
		cursor, _ = res.obj(t)["next_cursor"].(string)
	}
	sameOrder(t, "subscriptions after a delete and a create", rest, []string{subs[2], subs[3], subs[4], late})

	ids := b.deliveries(t, subs[0], 7, "m")
	var want []string
	for i := len(ids) - 1; i >= 0; i-- {
		want = append(want, fmt.Sprint(ids[i]))
	}
	got, pages = b.walk(t, "/api/v1/deliveries", 3)
	sameOrder(t, "deliveries (newest first)", got, want)
	if pages != 3 {
		t.Fatalf("7 deliveries at 3 a page took %d pages", pages)
	}
	// A new delivery during the walk is not seen by it (newest first, keyset).
	res = b.do(t, "GET", "/api/v1/deliveries?limit=3", "").want(t, http.StatusOK)
	cursor = res.obj(t)["next_cursor"].(string)
	b.deliveries(t, subs[0], 1, "m")
	rest = nil
	for cursor != "" {
		res = b.do(t, "GET", "/api/v1/deliveries?limit=3&cursor="+cursor, "").want(t, http.StatusOK)
		for _, it := range res.items(t) {
			rest = append(rest, fmt.Sprint(it["id"]))
		}
		cursor, _ = res.obj(t)["next_cursor"].(string)
	}
	sameOrder(t, "deliveries after an insert", rest, want[3:])
}

// Every class of bad input is a 4xx naming the field, and changes nothing.
func TestBadInput(t *testing.T) {
	b, ctx := setup(t)
	failed := b.failedRows(t, "assets", 1, "m")
	sub := b.createSubscription(t, "https://a.example.com/h")
	dels := b.deliveries(t, sub, 1, "m")
	s := "/api/v1/subscriptions/" + sub
	huge := `{"description": "` + strings.Repeat("x", maxBodyBytes) + `"}`

	snapshot := func() string {
		var out string
		err := b.db.Pool.QueryRow(ctx, `SELECT concat_ws(' | ',
  (SELECT string_agg(concat_ws(',', id, url, description, event_types::text, topic, enabled, disabled_reason), ';' ORDER BY id) FROM bridge.subscriptions),
  (SELECT string_agg(concat_ws(',', id, expires_at), ';' ORDER BY id) FROM bridge.subscription_secrets),
  (SELECT string_agg(concat_ws(',', id, status, attempts), ';' ORDER BY id) FROM bridge.outbox),
  (SELECT string_agg(concat_ws(',', id, status, attempts), ';' ORDER BY id) FROM bridge.deliveries))`).Scan(&out)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	before := snapshot()

	cases := []struct {
		name, method, path, body string
		status                   int
		field                    string
	}{
		// Malformed bodies.
		{"malformed JSON", "POST", "/api/v1/subscriptions", `{"url": "https://x.example.com",`, 400, "body"},
		{"syntax error", "POST", "/api/v1/subscriptions", `{"url": https://x}`, 400, "body"},
		{"not an object", "POST", "/api/v1/outbox/replay", `["` + failed[0] + `"]`, 400, "body"},
		{"null body", "POST", "/api/v1/outbox/replay", `null`, 400, "body"},
		{"empty body", "POST", "/api/v1/subscriptions", ``, 400, "body"},
		{"trailing data", "POST", "/api/v1/outbox/replay", `{"all_failed": true} {"all_failed": true}`, 400, "body"},
		{"oversize body", "PATCH", s, huge, 413, "body"},
		{"oversize replay", "POST", "/api/v1/outbox/replay", `{"ids": ["` + strings.Repeat("a", maxBodyBytes) + `"]}`, 413, "body"},
		// Unknown fields.
		{"unknown field", "POST", "/api/v1/subscriptions", `{"url": "https://x.example.com/h", "event_types": ["*"], "secret": "whsec_mine"}`, 400, "secret"},
		{"unknown field (typo)", "POST", "/api/v1/outbox/replay", `{"all_failed": true, "topics": "assets"}`, 400, "topics"},
		{"unknown field on enable", "POST", s + "/enable", `{"force": true}`, 400, "force"},
		{"unknown field on rotate", "POST", s + "/rotate-secret", `{"secret": "whsec_mine"}`, 400, "secret"},
		// A literal address the deliverer's dialer refuses is refused here.
		{"URL to the metadata address", "POST", "/api/v1/subscriptions", `{"url": "https://169.254.169.254/latest", "event_types": ["*"]}`, 400, "url"},
		{"URL to loopback (hex)", "PATCH", s, `{"url": "https://0x7f000001/h"}`, 400, "url"},
		// Wrong types.
		{"wrong type", "POST", "/api/v1/subscriptions", `{"url": 42, "event_types": ["*"]}`, 400, "url"},
		{"wrong element type", "POST", "/api/v1/deliveries/revive", `{"ids": ["1"]}`, 400, "ids"},
		{"fractional id", "POST", "/api/v1/deliveries/revive", `{"ids": [1.5]}`, 400, "ids"},
		{"wrong bool", "POST", "/api/v1/outbox/replay", `{"all_failed": "yes"}`, 400, "all_failed"},
		// Invalid URLs and values.
		{"relative URL", "POST", "/api/v1/subscriptions", `{"url": "/hooks", "event_types": ["*"]}`, 400, "url"},
		{"URL with credentials", "POST", "/api/v1/subscriptions", `{"url": "https://u:p@x.example.com/h", "event_types": ["*"]}`, 400, "url"},
		{"URL not http", "PATCH", s, `{"url": "ftp://x.example.com/h"}`, 400, "url"},
		{"URL garbage", "POST", "/api/v1/subscriptions", `{"url": "https://exa mple.com/%zz", "event_types": ["*"]}`, 400, "url"},
		{"no URL", "POST", "/api/v1/subscriptions", `{"event_types": ["*"]}`, 400, "url"},
		{"no event types", "POST", "/api/v1/subscriptions", `{"url": "https://x.example.com/h"}`, 400, "event_types"},
		{"empty event types", "POST", "/api/v1/subscriptions", `{"url": "https://x.example.com/h", "event_types": []}`, 400, "event_types"},
		{"bad wildcard", "PATCH", s, `{"url": "https://ok.example.com/h", "event_types": ["as*et"]}`, 400, "event_types"},
		{"NUL in text", "PATCH", s, `{"description": "a\u0000b"}`, 400, "description"},
		{"NUL in event type", "POST", "/api/v1/subscriptions", `{"url": "https://x.example.com/h", "event_types": ["a\u0000"]}`, 400, "event_types"},
		{"NUL in reason", "POST", s + "/disable", `{"reason": "\u0000"}`, 400, "reason"},
		{"empty patch", "PATCH", s, `{}`, 400, "body"},
		// Bounds: URLs and reasons that could never work or fill every
		// listing; ports that do not exist.
		{"URL too long", "POST", "/api/v1/subscriptions", `{"url": "https://x.example.com/` + strings.Repeat("a", 10000) + `", "event_types": ["*"]}`, 400, "url"},
		{"URL port out of range", "POST", "/api/v1/subscriptions", `{"url": "https://x.example.com:99999/h", "event_types": ["*"]}`, 400, "url"},
		{"URL port 0", "PATCH", s, `{"url": "https://x.example.com:0/h"}`, 400, "url"},
		{"URL with a space", "POST", "/api/v1/subscriptions", `{"url": "https://x.example.com/a b", "event_types": ["*"]}`, 400, "url"},
		{"reason too long", "POST", s + "/disable", `{"reason": "` + strings.Repeat("r", 100000) + `"}`, 400, "reason"},
		// Strict JSON: keys are case-sensitive, each given once.
		{"key in the wrong case", "POST", "/api/v1/subscriptions", `{"URL": "https://x.example.com/h", "event_types": ["*"]}`, 400, "URL"},
		{"key in the wrong case (patch)", "PATCH", s, `{"Description": "x"}`, 400, "Description"},
		{"duplicate key", "POST", "/api/v1/subscriptions", `{"url": "https://x.example.com/h", "event_types": ["*"], "url": "https://evil.example.com/h"}`, 400, "url"},
		{"duplicate key (replay)", "POST", "/api/v1/outbox/replay", `{"all_failed": false, "all_failed": true}`, 400, "all_failed"},
		// Bad UUIDs and ids.
		{"bad UUID in path", "GET", "/api/v1/subscriptions/not-a-uuid", ``, 400, "id"},
		{"bad UUID in path (patch)", "PATCH", "/api/v1/subscriptions/123", `{"description": "x"}`, 400, "id"},
		{"bad UUID in path (delete)", "DELETE", "/api/v1/subscriptions/123", ``, 400, "id"},
		{"bad UUID in path (rotate)", "POST", "/api/v1/subscriptions/123/rotate-secret", ``, 400, "id"},
		{"bad UUID in path (enable)", "POST", "/api/v1/subscriptions/123/enable", ``, 400, "id"},
		{"bad UUID in path (disable)", "POST", "/api/v1/subscriptions/123/disable", ``, 400, "id"},
		{"bad UUID in ids", "POST", "/api/v1/outbox/replay", `{"ids": ["` + failed[0] + `", "nope"]}`, 400, "ids[1]"},
		{"bad UUID in subscription_id", "POST", "/api/v1/deliveries/revive", `{"subscription_id": "nope", "dead": true}`, 400, "subscription_id"},
		{"bad delivery id", "GET", "/api/v1/deliveries/abc", ``, 400, "id"},
		{"zero delivery id", "GET", "/api/v1/deliveries/0/attempts", ``, 400, "id"},
		{"negative id in revive", "POST", "/api/v1/deliveries/revive", fmt.Sprintf(`{"ids": [%d, -1]}`, dels[0]), 400, "ids[1]"},
		// Selectors.
		{"replay without selector", "POST", "/api/v1/outbox/replay", `{}`, 400, "ids"},
		{"replay with both", "POST", "/api/v1/outbox/replay", `{"ids": ["` + failed[0] + `"], "all_failed": true}`, 400, "all_failed"},
		{"replay empty ids", "POST", "/api/v1/outbox/replay", `{"ids": []}`, 400, "ids"},
		{"topic without all_failed", "POST", "/api/v1/outbox/replay", `{"ids": ["` + failed[0] + `"], "topic": "assets"}`, 400, "topic"},
		{"negative rate limit", "POST", "/api/v1/subscriptions", `{"url": "https://x.example.com/h", "event_types": ["*"], "rate_limit": -5}`, 400, "rate_limit"},
		{"rate limit a string", "POST", "/api/v1/subscriptions", `{"url": "https://x.example.com/h", "event_types": ["*"], "rate_limit": "fast"}`, 400, "rate_limit"},
		{"fractional rate limit", "POST", "/api/v1/subscriptions", `{"url": "https://x.example.com/h", "event_types": ["*"], "rate_limit": 2.5}`, 400, "rate_limit"},
		{"zero burst", "PATCH", s, `{"rate_limit": 10, "rate_burst": 0}`, 400, "rate_burst"},
		{"burst alone", "PATCH", s, `{"rate_burst": 3}`, 400, "rate_burst"},
		{"bad since", "POST", "/api/v1/outbox/replay", `{"all_failed": true, "since": "yesterday"}`, 400, "since"},
		{"negative since", "POST", "/api/v1/outbox/replay", `{"all_failed": true, "since": "-1h"}`, 400, "since"},
		{"revive without selector", "POST", "/api/v1/deliveries/revive", `{}`, 400, "ids"},
		{"revive sub without dead", "POST", "/api/v1/deliveries/revive", `{"subscription_id": "` + sub + `"}`, 400, "dead"},
		{"revive dead without sub", "POST", "/api/v1/deliveries/revive", `{"dead": true}`, 400, "subscription_id"},
		{"revive both", "POST", "/api/v1/deliveries/revive", fmt.Sprintf(`{"ids": [%d], "subscription_id": %q, "dead": true}`, dels[0], sub), 400, "ids"},
		// Query strings.
		{"unknown query parameter", "GET", "/api/v1/deliveries?subscription_id=" + sub, ``, 400, "subscription_id"},
		{"query on stats", "GET", "/api/v1/outbox/stats?verbose=1", ``, 400, "verbose"},
		{"repeated parameter", "GET", "/api/v1/outbox/failed?limit=1&limit=2", ``, 400, "limit"},
		{"limit zero", "GET", "/api/v1/outbox/failed?limit=0", ``, 400, "limit"},
		{"limit too big", "GET", "/api/v1/subscriptions?limit=1001", ``, 400, "limit"},
		{"limit not a number", "GET", "/api/v1/deliveries?limit=ten", ``, 400, "limit"},
		{"garbage cursor", "GET", "/api/v1/outbox/failed?cursor=%%%", ``, 400, "query"},
		{"bad cursor", "GET", "/api/v1/outbox/failed?cursor=bm9wZQ", ``, 400, "cursor"},
		{"cursor of another list", "GET", "/api/v1/deliveries?cursor=" + encodeCursor(cursorFailed, "5"), ``, 400, "cursor"},
		{"tampered cursor", "GET", "/api/v1/deliveries?cursor=" + encodeCursor(cursorDeliveries, "-3"), ``, 400, "cursor"},
		{"tampered subscriptions cursor", "GET", "/api/v1/subscriptions?cursor=" + encodeCursor(cursorSubscriptions, "1/x"), ``, 400, "cursor"},
		{"bad status filter", "GET", "/api/v1/deliveries?status=lost", ``, 400, "status"},
		{"bad subscription filter", "GET", "/api/v1/deliveries?subscription=42", ``, 400, "subscription"},
		{"invalid UTF-8 in query", "GET", "/api/v1/outbox/failed?topic=%ff", ``, 400, "topic"},
		{"NUL in query", "GET", "/api/v1/deliveries?asset=%00", ``, 400, "asset"},
	}
	for _, c := range cases {
		res := b.do(t, c.method, c.path, c.body)
		if res.Status != c.status {
			t.Errorf("%s: %s %s → %d, want %d: %s", c.name, c.method, c.path, res.Status, c.status, res.Body)
			continue
		}
		res.wantError(t, c.status, c.field)
	}

	// Unknown paths and methods: JSON too.
	b.do(t, "GET", "/api/v1/nope", "").wantError(t, http.StatusNotFound, "")
	res := b.do(t, "DELETE", "/api/v1/outbox/stats", "")
	res.wantError(t, http.StatusMethodNotAllowed, "")
	if !strings.Contains(res.Header.Get("Allow"), "GET") {
		t.Fatalf("405 without Allow: %v", res.Header)
	}

	if after := snapshot(); after != before {
		t.Fatalf("bad input changed the database:\nbefore %s\nafter  %s", before, after)
	}
}

// Every operation that takes a body refuses one over 1 MiB with 413 before
// reading any of it as JSON, and writes nothing.
func TestOversizeBodies(t *testing.T) {
	b, _ := setup(t)
	sub := b.createSubscription(t, "https://a.example.com/h")
	doc, _ := spec(t)
	huge := `{"description": "` + strings.Repeat("x", maxBodyBytes) + `"}`
	n := 0
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.Responses.Status(413) == nil {
				continue
			}
			n++
			b.do(t, method, strings.ReplaceAll(path, "{id}", sub), huge).wantError(t, http.StatusRequestEntityTooLarge, "body")
		}
	}
	if n < 7 {
		t.Fatalf("only %d operations document 413", n)
	}
	var count int
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM bridge.subscriptions`).Scan(&count); err != nil {
		t.Fatal(err)
	}
	got := b.do(t, "GET", "/api/v1/subscriptions/"+sub, "").want(t, http.StatusOK).obj(t)
	if count != 1 || got["description"] != "" || got["enabled"] != true || len(got["secrets"].([]any)) != 1 {
		t.Fatalf("an oversize body changed something: %d subscriptions, %v", count, got)
	}
}

// A request without a body (rotate-secret) given one names no fields: the
// message says it takes none, not "known fields: )".
func TestKnownFieldsOfABodilessRequest(t *testing.T) {
	if got := knownFields(&struct{}{}); got != "none: this request takes no body" {
		t.Errorf("knownFields(empty) = %q", got)
	}
}
