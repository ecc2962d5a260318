package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/adminapi"
	"github.com/outboxbridge/bridge/internal/console"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/opsserver"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/tracing"
	"github.com/outboxbridge/bridge/outbox"
)

const (
	token  = "console-test-token-5f1c9a2e7b"
	script = `<script>alert(1)</script>`
)

// chromium returns the path of Debian's chromium, failing under CI=true
// (the Makefile's test target installs it) and skipping otherwise.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testkit.Unavailable(t, "chromium (a headless browser)", "`apt-get install -y chromium` (make test installs it)", errors.New("not on PATH"))
	return ""
}

// receiver is the subscribers' endpoint: /ok answers 204, /fail answers 500
// with a script in its body until fixed.
type receiver struct {
	fixed atomic.Bool
	mu    sync.Mutex
	got   map[string]int // path → requests
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	rc.mu.Lock()
	rc.got[r.URL.Path]++
	rc.mu.Unlock()
	if r.URL.Path == "/fail" && !rc.fixed.Load() {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, "upstream broke: "+script)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// authCounter counts what would be bridge_admin_auth_failures_total.
type authCounter struct{ n *atomic.Int64 }

func (a authCounter) AuthFailure() { a.n.Add(1) }

// TestConsoleInBrowser drives the console in a real headless Chromium
// against a real ops server, PostgreSQL, Kafka and Jaeger, with a relay, a
// consumer and a deliverer running in the test process: sign-in (wrong and
// right), every page with the rows the test made, replay, revive, rotate,
// disable/enable, delete, a forged POST, escaping, a trace drawn from
// Jaeger, sign-out. Screenshots go to $BRIDGE_CONSOLE_SCREENSHOTS (the
// committed ones in docs/console/ come from it) or a temporary directory.
func TestConsoleInBrowser(t *testing.T) {
	chrome := chromium(t)
	top := t // the pipeline outlives the subtest that starts it
	db := pgtest.New(t)
	brokers := kafkatest.RealBrokers(t)
	otlp, query := testkit.Jaeger(t)
	topic := kafkatest.CreateTopic(t, brokers, 1, nil)
	group := "g-" + topic
	shots := os.Getenv("BRIDGE_CONSOLE_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	newTP := func(service string) *tracing.Provider {
		p, err := tracing.New(ctx, tracing.Config{ServiceName: service, Endpoint: "http://" + otlp + "/v1/traces",
			Protocol: tracing.ProtocolHTTP, Resource: []attribute.KeyValue{attribute.String("test.name", t.Name())}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
		return p
	}
	appTP, relayTP, consumeTP, deliverTP := newTP("console-test-app"), newTP("outbox-bridge-relay"), newTP("outbox-bridge-consume"), newTP("outbox-bridge-deliver")

	rc := &receiver{got: map[string]int{}}
	recv := httptest.NewServer(rc)
	defer recv.Close()

	// The bridge's ops server with the admin API and the console.
	logs := &testkit.LogBuffer{}
	var authFailures atomic.Int64
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(logs, t.Output()), nil))
	ops := opsserver.New(opsserver.Config{Addr: "127.0.0.1:0", Logger: logger})
	api := adminapi.Config{Token: token, Pool: db.Pool, AllowHTTP: true, SecretGrace: time.Hour, Logger: logger, AllowedCIDRs: loopback}
	adminapi.Mount(ops, api)
	api.Metrics = authCounter{&authFailures} // the console's wrong tokens only
	kcfg := kafkaConfig(brokers)
	ui, err := console.Mount(ops, console.Config{Config: api,
		JaegerQueryURL: query, JaegerUIURL: "http://jaeger-ui.invalid:16686", Kafka: kcfg, ConsumerGroup: group,
		SampleEvery: time.Second})
	if err != nil || ui == nil {
		t.Fatalf("console.Mount = %v, %v", ui, err)
	}
	defer ui.Close()
	if err := ops.Start(); err != nil {
		t.Fatal(err)
	}
	defer ops.Shutdown(context.Background())
	base := "http://" + ops.Addr()

	// The browser: Debian's chromium, headless, a fresh profile.
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chrome),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
	)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(alloc)
	defer cancelBrowser()
	var dialogs atomic.Int32
	if err := chromedp.Listen(bctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
			go chromedp.Call(bctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false}) //nolint:errcheck
		}
	}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	b := &browser{t: t, ctx: bctx, base: base, shots: shots}

	// Data the pages must show: a parked (FAILED) row carrying a script in
	// its payload, header and error, in a trace of its own.
	actx, appSpan := appTP.Tracer("console-test").Start(ctx, "POST /assets/a-1/publish", trace.WithSpanKind(trace.SpanKindServer))
	var failedID uuid.UUID
	err = pgx.BeginFunc(actx, db.Pool, func(tx pgx.Tx) error {
		var err error
		failedID, err = outbox.Enqueue(actx, tx, outbox.Event{Topic: topic, AssetID: "a-1", EventType: "asset.version_published",
			Payload: json.RawMessage(`{"title":"` + strings.ReplaceAll(script, `"`, `\"`) + `"}`), Headers: map[string]string{"x-note": script}})
		if err != nil {
			return err
		}
		// Parked in the same transaction: the relay never sees it NEW.
		_, err = tx.Exec(actx, `UPDATE bridge.outbox SET status = 'FAILED', attempts = 10, failed_at = now(), last_error = $2 WHERE id = $1`,
			failedID, "broker refused: "+script)
		return err
	})
	appSpan.End()
	if err != nil {
		t.Fatal(err)
	}
	traceID := appSpan.SpanContext().TraceID().String()

	t.Run("sign in with a wrong token", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.ID("token")))
		b.shot("login")
		b.do(chromedp.SendKeys(chromedp.ID("token"), "not-the-token"), chromedp.Click(chromedp.ID("signin")),
			chromedp.WaitVisible(chromedp.ID("login-error")))
		if got := b.text("#login-error"); !strings.Contains(got, "not the admin token") {
			t.Fatalf("login error = %q", got)
		}
		if n := authFailures.Load(); n != 1 {
			t.Fatalf("rejected sign-ins counted: %d, want 1", n)
		}
		if !strings.Contains(logs.String(), "admin API request rejected") || !strings.Contains(logs.String(), "path=/ui/login") {
			t.Fatalf("the wrong token was not logged like a rejected API call:\n%s", logs)
		}
	})

	t.Run("sign in", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/login"), chromedp.WaitVisible(chromedp.ID("token")),
			chromedp.SendKeys(chromedp.ID("token"), token), chromedp.Click(chromedp.ID("signin")),
			chromedp.WaitVisible(chromedp.ID("topics")))
		cookies := b.cookies()
		ck, ok := cookies["bridge_console"]
		if !ok || !ck.HTTPOnly || ck.SameSite != "Strict" || ck.Expires <= 0 {
			t.Fatalf("session cookie = %+v, want HttpOnly, SameSite=Strict, expiring", ck)
		}
		b.waitText("#topics", topic)
	})

	t.Run("outbox lists the parked row, escaped", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/outbox?topic="+topic), chromedp.WaitVisible(chromedp.ID("failed")))
		b.waitText("#failed", "broker refused: "+script)
		b.shot("outbox")
		b.do(chromedp.Navigate(base+"/ui/outbox/"+failedID.String()), chromedp.WaitVisible(chromedp.ID("headers")))
		if got := b.text("#headers"); !strings.Contains(got, script) {
			t.Fatalf("headers = %q", got)
		}
		if b.exists("#payload") {
			t.Fatal("the payload is shown before it was asked for")
		}
		b.do(chromedp.Click(chromedp.ID("show-payload")), chromedp.WaitVisible(chromedp.ID("payload")))
		if got := b.text("#payload"); !strings.Contains(got, script) {
			t.Fatalf("payload = %q, want the script as text", got)
		}
		if n := b.count("script:not([src])"); n != 0 {
			t.Fatalf("%d inline script elements on the page: the payload was not escaped", n)
		}
		if b.text("#trace-link") != traceID {
			t.Fatalf("trace link = %q, want %s", b.text("#trace-link"), traceID)
		}
		b.shot("outbox-row")
	})

	t.Run("replay: NEW, then SENT once a relay runs", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Click(chromedp.ID("replay-one")), chromedp.WaitVisible(chromedp.ID("flash")))
		b.waitText("#status", "NEW")
		// Now the pipeline: relay, consumer and deliverer, and a
		// subscription for the replayed event.
		startPipeline(top, ctx, db.Pool, brokers, topic, group, relayTP, consumeTP, deliverTP)
		b.waitText("#status", "SENT") // the page updates itself
	})

	var subID, okURL string
	t.Run("subscriptions: create shows the secret once", func(t *testing.T) {
		b.t = t
		okURL = recv.URL + "/ok"
		b.do(chromedp.Navigate(base+"/ui/subscriptions"), chromedp.WaitVisible(chromedp.ID("create")),
			chromedp.SendKeys(chromedp.CSS(`#create input[name=url]`), okURL),
			chromedp.SendKeys(chromedp.CSS(`#create input[name=event_types]`), "asset.*"),
			chromedp.SendKeys(chromedp.CSS(`#create input[name=description]`), "desc "+script),
			chromedp.Click(chromedp.ID("create-submit")), chromedp.WaitVisible(chromedp.ID("secret")))
		secret := b.text("#secret")
		if !strings.HasPrefix(secret, "whsec_") {
			t.Fatalf("secret = %q", secret)
		}
		b.do(chromedp.Click(chromedp.ID("copy")))
		b.waitText("#copy", "Copied")
		href := b.eval(`document.querySelector('main a[href^="/ui/subscriptions/"]').getAttribute("href")`)
		subID = strings.TrimPrefix(href, "/ui/subscriptions/")
		b.do(chromedp.Navigate(base+"/ui/subscriptions"), chromedp.WaitVisible(chromedp.ID("subscriptions")))
		b.waitText("#subscriptions", okURL)
		b.waitText("#subscriptions", "desc "+script)
		b.shot("subscriptions")
		for _, path := range []string{"/ui/subscriptions", "/ui/subscriptions/" + subID, "/ui/"} {
			b.do(chromedp.Navigate(base + path))
			if html := b.html(); strings.Contains(html, secret) {
				t.Fatalf("%s shows the signing secret", path)
			}
		}
	})

	t.Run("a delivered event's trace, drawn from Jaeger", func(t *testing.T) {
		b.t = t
		// The replayed event was published before the subscription
		// existed; a new one in the same kind of trace goes to it.
		actx, span := appTP.Tracer("console-test").Start(ctx, "POST /assets/a-2/publish", trace.WithSpanKind(trace.SpanKindServer))
		err := pgx.BeginFunc(actx, db.Pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(actx, tx, outbox.Event{Topic: topic, AssetID: "a-2", EventType: "asset.version_published", Payload: json.RawMessage(`{"v":2}`)})
			return err
		})
		span.End()
		if err != nil {
			t.Fatal(err)
		}
		tid := span.SpanContext().TraceID().String()
		b.eventually(90*time.Second, func() string {
			b.do(chromedp.Navigate(base+"/ui/deliveries?subscription="+subID+"&status=delivered"), chromedp.WaitVisible(chromedp.ID("deliveries")))
			if !strings.Contains(b.text("#deliveries"), "asset.version_published") {
				var st string
				var n int
				_ = db.Pool.QueryRow(ctx, `SELECT string_agg(asset_id || ':' || status, ','), (SELECT count(*) FROM bridge.deliveries) FROM bridge.outbox`).Scan(&st, &n)
				return fmt.Sprintf("not delivered yet (outbox %s, %d deliveries)", st, n)
			}
			return ""
		})
		b.shot("deliveries")
		for _, tp := range []*tracing.Provider{appTP, relayTP, consumeTP, deliverTP} {
			if err := tp.ForceFlush(ctx); err != nil {
				t.Fatal(err)
			}
		}
		b.eventually(120*time.Second, func() string {
			b.do(chromedp.Navigate(base + "/ui/trace/" + tid))
			if !b.exists("#waterfall") {
				return "no waterfall yet"
			}
			wf := b.text("#waterfall")
			for _, want := range []string{"POST /assets/a-2/publish", "publish " + topic, "process " + topic, "webhook POST"} {
				if !strings.Contains(wf, want) {
					for _, tp := range []*tracing.Provider{appTP, relayTP, consumeTP, deliverTP} {
						_ = tp.ForceFlush(ctx)
					}
					return "waterfall lacks " + want + ": " + wf
				}
			}
			return ""
		})
		gaps := b.text("#gaps")
		for _, want := range []string{"in the outbox", "in Kafka", "in the delivery queue"} {
			if !strings.Contains(gaps, want) {
				t.Fatalf("gaps = %q, want %q", gaps, want)
			}
		}
		if !b.exists("#jaeger-ui") {
			t.Fatal("no link to JAEGER_UI_URL")
		}
		b.shot("trace")
	})

	t.Run("rotate, disable with a reason, enable", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/subscriptions/"+subID), chromedp.WaitVisible(chromedp.ID("rotate")))
		b.shot("subscription")
		b.do(chromedp.Click(chromedp.ID("rotate")), chromedp.WaitVisible(chromedp.ID("grace")))
		if !strings.HasPrefix(b.text("#secret"), "whsec_") || !strings.Contains(b.text("#grace"), "1h0m0s") {
			t.Fatalf("rotate page: secret %q, grace %q", b.text("#secret"), b.text("#grace"))
		}
		b.shot("rotate")
		b.do(chromedp.Navigate(base+"/ui/subscriptions/"+subID), chromedp.WaitVisible(chromedp.ID("disable")),
			chromedp.SendKeys(chromedp.ID("disable-reason"), "maintenance "+script), chromedp.Click(chromedp.ID("disable")),
			chromedp.WaitVisible(chromedp.ID("enable")))
		if got := b.text("#disabled-reason"); got != "maintenance "+script {
			t.Fatalf("disabled reason = %q", got)
		}
		b.do(chromedp.Click(chromedp.ID("enable")), chromedp.WaitVisible(chromedp.ID("disable")))
		b.waitText("#state", "enabled")
	})

	t.Run("a forged POST without the CSRF token is refused", func(t *testing.T) {
		b.t = t
		status, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](`fetch("/ui/subscriptions/`+subID+`/disable", {method: "POST",
			headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "reason=forged"}).then(r => r.status)`,
			chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatal(err)
		}
		if status != http.StatusForbidden {
			t.Fatalf("forged POST answered %d, want 403", status)
		}
		sub, err := store.NewSubscriptionStore(db.Pool, true, 0).Get(ctx, subID)
		if err != nil || !sub.Enabled {
			t.Fatalf("after the forged POST the subscription is %+v, %v", sub, err)
		}
	})

	t.Run("dead delivery: attempt log escaped, revive, delivered", func(t *testing.T) {
		b.t = t
		subs := store.NewSubscriptionStore(db.Pool, true, 0)
		failURL := recv.URL + "/fail"
		sub, err := subs.Create(ctx, store.SubscriptionInput{URL: &failURL, EventTypes: []string{"fail.*"}})
		if err != nil {
			t.Fatal(err)
		}
		err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: topic, AssetID: "a-3", EventType: "fail.now", Payload: json.RawMessage(`{"x":3}`)})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		b.eventually(120*time.Second, func() string {
			b.do(chromedp.Navigate(base + "/ui/deliveries?status=dead&subscription=" + sub.ID))
			if !strings.Contains(b.text("#deliveries"), "fail.now") {
				return "no dead delivery listed yet"
			}
			return ""
		})
		b.do(chromedp.Click(chromedp.CSS(`#deliveries a[href^="/ui/deliveries/"]`)), chromedp.WaitVisible(chromedp.ID("attempts")))
		if got := b.text("#attempts"); !strings.Contains(got, "upstream broke: "+script) {
			t.Fatalf("attempt log = %q, want the answer excerpt as text", got)
		}
		b.shot("delivery")
		rc.fixed.Store(true)
		b.do(chromedp.Click(chromedp.ID("revive-one")), chromedp.WaitVisible(chromedp.ID("flash")))
		if !strings.Contains(b.text("#flash"), "Revived 1") {
			t.Fatalf("flash = %q", b.text("#flash"))
		}
		b.eventually(90*time.Second, func() string {
			b.do(chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("status")))
			if got := b.text("#status"); got != "delivered" {
				return "status " + got
			}
			return ""
		})
		b.do(chromedp.Navigate(base+"/ui/streams?subscription="+subID+"&asset=a-2"), chromedp.WaitVisible(chromedp.ID("stream")))
		b.shot("stream")
	})

	t.Run("send a test event, delete with typed confirmation", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/subscriptions/"+subID), chromedp.WaitVisible(chromedp.ID("send-test")),
			chromedp.Click(chromedp.ID("send-test")), chromedp.WaitVisible(chromedp.ID("flash")))
		b.eventually(90*time.Second, func() string {
			b.do(chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("status")))
			if got := b.text("#status"); got != "delivered" {
				return "test event " + got
			}
			return ""
		})
		b.do(chromedp.Navigate(base+"/ui/subscriptions/"+subID), chromedp.WaitVisible(chromedp.ID("delete-confirm")),
			chromedp.SetAttributeValue(chromedp.ID("delete-confirm"), "pattern", ".*"), // let the server check it
			chromedp.SendKeys(chromedp.ID("delete-confirm"), "nope"), chromedp.Click(chromedp.ID("delete")),
			chromedp.WaitVisible(chromedp.ID("error")))
		if _, err := store.NewSubscriptionStore(db.Pool, true, 0).Get(ctx, subID); err != nil {
			t.Fatalf("a wrong confirmation deleted the subscription: %v", err)
		}
		b.do(chromedp.Navigate(base+"/ui/subscriptions/"+subID), chromedp.WaitVisible(chromedp.ID("delete-confirm")),
			chromedp.SendKeys(chromedp.ID("delete-confirm"), subID[:8]), chromedp.Click(chromedp.ID("delete")),
			chromedp.WaitVisible(chromedp.ID("flash")))
		if _, err := store.NewSubscriptionStore(db.Pool, true, 0).Get(ctx, subID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("after delete: %v", err)
		}
	})

	t.Run("overview", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.ID("topics")))
		b.waitText("#subs", recv.URL+"/fail")
		b.waitText("#topics", topic)
		b.shot("overview")
		// Phone width: the page stays usable (no horizontal scroll of the
		// page itself; wide tables scroll in their own box).
		b.do(chromedp.EmulateViewport(390, 844))
		b.do(chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.ID("topics")))
		scrollW, clientW := b.num(`document.documentElement.scrollWidth`), b.num(`document.documentElement.clientWidth`)
		b.shot("overview-phone")
		if scrollW > clientW+2 {
			t.Errorf("at phone width the page is %dpx wide in a %dpx window", scrollW, clientW)
		}
		b.do(chromedp.EmulateViewport(1280, 800))
	})

	t.Run("sign out", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.ID("signout")),
			chromedp.Click(chromedp.ID("signout")), chromedp.WaitVisible(chromedp.ID("token")))
		b.do(chromedp.Navigate(base+"/ui/outbox"), chromedp.WaitVisible(chromedp.ID("token")))
	})

	if n := dialogs.Load(); n != 0 {
		t.Fatalf("%d JavaScript dialogs opened: something ran a script from the data", n)
	}
}
