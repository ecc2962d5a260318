package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/adminapi"
	"github.com/outboxbridge/bridge/internal/audit"
	"github.com/outboxbridge/bridge/internal/console"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/opsserver"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/outbox"
)

// newBrowser starts Debian's chromium, headless, with a fresh profile, on
// base.
func newBrowser(t *testing.T, ctx context.Context, chrome, base string) *browser {
	t.Helper()
	shots := os.Getenv("BRIDGE_CONSOLE_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
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
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return &browser{t: t, ctx: bctx, base: base, shots: shots}
}

// actionsFixture is the console under test and the database it acts on.
type actionsFixture struct {
	db   *pgtest.DB
	ctx  context.Context
	base string
}

func (f *actionsFixture) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := f.db.Pool.QueryRow(f.ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (f *actionsFixture) outboxCount(t *testing.T, topic, status string) int64 {
	t.Helper()
	return f.count(t, `SELECT count(*) FROM bridge.outbox WHERE topic = $1 AND status = $2`, topic, status)
}

func (f *actionsFixture) deliveryCount(t *testing.T, sub, status string) int64 {
	t.Helper()
	return f.count(t, `SELECT count(*) FROM bridge.deliveries WHERE subscription_id = $1 AND status = $2`, sub, status)
}

// audited returns the audit log's entries for action (newest first).
func (f *actionsFixture) audited(t *testing.T, action string) []audit.Entry {
	t.Helper()
	return pgtest.Structs[audit.Entry](t, f.db.Pool, `SELECT id, at, actor, via, remote, action, target, scope, row_count
		FROM bridge.audit_log WHERE action = $1 ORDER BY id DESC`, action)
}

// lastAudit checks that the newest entry of action came from the console
// with this many rows, and returns it.
func (f *actionsFixture) lastAudit(t *testing.T, action string, rows int64) audit.Entry {
	t.Helper()
	es := f.audited(t, action)
	if len(es) == 0 {
		t.Fatalf("no %s in the audit log", action)
	}
	e := es[0]
	if e.Via != audit.ViaConsole || e.Rows != rows || e.Actor != audit.TokenID(token) || e.Remote != "127.0.0.1" {
		t.Fatalf("audit entry %+v: want via console, %d rows, actor %s, remote 127.0.0.1", e, rows, audit.TokenID(token))
	}
	return e
}

// enqueue writes n events to topic in one transaction and returns their ids
// in seq order.
func (f *actionsFixture) enqueue(t *testing.T, topic string, n int, lastError string) []uuid.UUID {
	t.Helper()
	var ids []uuid.UUID
	err := pgx.BeginFunc(f.ctx, f.db.Pool, func(tx pgx.Tx) error {
		for i := range n {
			id, err := outbox.Enqueue(f.ctx, tx, outbox.Event{Topic: topic, AssetID: fmt.Sprintf("%s-%d", topic, i%7), EventType: "asset.changed",
				Payload: json.RawMessage(`{"i":` + strconv.Itoa(i) + `}`)})
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		if lastError != "" {
			_, err := tx.Exec(f.ctx, `UPDATE bridge.outbox SET status = 'FAILED', attempts = 10, failed_at = now(), last_error = $2 WHERE topic = $1`, topic, lastError)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// collectPages walks a list from its first page through every "Next page"
// link and returns what each page showed (ids, by pageIDs), failing on an
// id shown twice.
func collectPages(b *browser, first, table string, pageIDs func() []string) []string {
	b.t.Helper()
	b.do(chromedp.Navigate(b.base+first), chromedp.WaitVisible(chromedp.ID(table)))
	var all []string
	seen := map[string]int{}
	for page := 1; ; page++ {
		ids := pageIDs()
		for _, id := range ids {
			if p, dup := seen[id]; dup {
				b.t.Fatalf("%s: %s is on page %d and again on page %d", first, id, p, page)
			}
			seen[id] = page
		}
		all = append(all, ids...)
		if !b.exists("#next") {
			return all
		}
		if page > 20 {
			b.t.Fatalf("%s: more than 20 pages", first)
		}
		b.do(chromedp.Click(chromedp.ID("next")), chromedp.WaitVisible(chromedp.ID(table)))
	}
}

func sameSet(t *testing.T, what string, got, want []string) {
	t.Helper()
	g, w := slices.Clone(got), slices.Clone(want)
	slices.Sort(g)
	slices.Sort(w)
	if !slices.Equal(g, w) {
		t.Fatalf("%s: the pages showed %d ids, want the %d in the database (first differences: got %v… want %v…)",
			what, len(g), len(w), g[:min(3, len(g))], w[:min(3, len(w))])
	}
}

func idStrings[T any](ids []T) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = fmt.Sprint(id)
	}
	return out
}

// TestConsoleActionsInBrowser performs every state-changing action of the
// console in a real headless Chromium and checks, in the database, what
// each one changed and what it did not: rows outside its scope untouched,
// the count on the confirmation page equal to the rows changed, the audit
// log's entry, and that reloading the page after it repeats nothing. It
// pages every list over several pages (no row repeated, none skipped).
func TestConsoleActionsInBrowser(t *testing.T) {
	chrome := chromium(t)
	db := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(t.Output()), &slog.HandlerOptions{Level: slog.LevelWarn}))
	ops := opsserver.New(opsserver.Config{Addr: "127.0.0.1:0", Logger: logger})
	api := adminapi.Config{Token: token, Pool: db.Pool, AllowHTTP: true, SecretGrace: time.Hour, Logger: logger, AllowedCIDRs: loopback}
	adminapi.Mount(ops, api)
	ui, err := console.Mount(ops, console.Config{Config: api, SampleEvery: time.Second})
	if err != nil || ui == nil {
		t.Fatalf("console.Mount = %v, %v", ui, err)
	}
	defer ui.Close()
	if err := ops.Start(); err != nil {
		t.Fatal(err)
	}
	defer ops.Shutdown(context.Background())
	base := "http://" + ops.Addr()
	f := &actionsFixture{db: db, ctx: ctx, base: base}
	b := newBrowser(t, ctx, chrome, base)

	// The outbox: 2 FAILED rows in tinya, 130 in tinyb (the filtered
	// replay-all and the paging), 120 NEW in tinynew, 110 SENT in tinysent
	// with sent_at tied in threes (the SENT view's cursor), and one FAILED
	// row whose error carries an ESC character.
	tinya := f.enqueue(t, "tinya", 2, "broker refused: topic authorization failed")
	tinyb := f.enqueue(t, "tinyb", 130, "broker refused: message too large")
	tinynew := f.enqueue(t, "tinynew", 120, "")
	tinysent := f.enqueue(t, "tinysent", 110, "")
	esc := f.enqueue(t, "tinyesc", 1, "colour \x1b[31mred\x1b[0m from the broker")
	if _, err := db.Pool.Exec(ctx, `UPDATE bridge.outbox SET status = 'SENT', sent_at = date_trunc('second', now()) - (seq / 3) * interval '1 second',
		kafka_partition = 0, kafka_offset = seq WHERE topic = 'tinysent'`); err != nil {
		t.Fatal(err)
	}
	// 60 audit entries from elsewhere: the audit page has pages to turn.
	for i := range 60 {
		if err := audit.Record(ctx, db.Pool, audit.Entry{Actor: "token:fixture", Via: audit.ViaAPI, Remote: "192.0.2.1", Action: audit.SubscriptionUpdate,
			Target: fmt.Sprintf("fixture-%d", i), Rows: 1}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("sign in", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/login"), chromedp.WaitVisible(chromedp.ID("token")),
			chromedp.SendKeys(chromedp.ID("token"), token), chromedp.Click(chromedp.ID("signin")),
			chromedp.WaitVisible(chromedp.ID("failed-card")))
		if got := b.text("#failed"); got != "133" {
			t.Fatalf("FAILED card = %q, want 133", got)
		}
	})

	t.Run("replay all that match a filter replays the filter's rows only", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/outbox?topic=tinya"), chromedp.WaitVisible(chromedp.ID("failed-total")))
		if got := b.text("#failed-total"); got != "2 FAILED rows match" {
			t.Fatalf("total = %q", got)
		}
		b.do(chromedp.Click(chromedp.ID("replay-all")), chromedp.WaitVisible(chromedp.ID("confirm-count")))
		if got := b.text("#confirm-count"); got != "2" {
			t.Fatalf("the confirmation asks to replay %s rows; the filter matches 2", got)
		}
		b.do(chromedp.Click(chromedp.ID("confirm-replay")), chromedp.WaitVisible(chromedp.ID("flash")))
		if got := b.text("#flash"); !strings.Contains(got, "Replayed 2 FAILED rows") {
			t.Fatalf("flash = %q", got)
		}
		sameSet(t, "NEW rows of tinya", idStrings(pgtest.Column[uuid.UUID](t, db.Pool, `SELECT id FROM bridge.outbox WHERE status = 'NEW' AND topic LIKE 'tiny_'`)), idStrings(tinya))
		if n := f.outboxCount(t, "tinyb", "FAILED"); n != 130 {
			t.Fatalf("tinyb (outside the filter): %d FAILED, want all 130 untouched", n)
		}
		if n := f.outboxCount(t, "tinyesc", "FAILED"); n != 1 {
			t.Fatalf("tinyesc (outside the filter): %d FAILED, want 1", n)
		}
		e := f.lastAudit(t, audit.OutboxReplayMatching, 2)
		if e.Scope != "topic=tinya" {
			t.Fatalf("audit scope = %q", e.Scope)
		}
		// Reloading the page the action ended on repeats nothing.
		b.do(chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("failed-total")))
		if n := len(f.audited(t, audit.OutboxReplayMatching)); n != 1 {
			t.Fatalf("after a reload the audit log holds %d replays, want 1", n)
		}
	})

	t.Run("the FAILED list pages through every row once", func(t *testing.T) {
		b.t = t
		got := collectPages(b, "/ui/outbox?topic=tinyb", "failed", func() []string {
			return strings.Fields(b.eval(`Array.from(document.querySelectorAll('#failed input[name=id]')).map(e => e.value).join(' ')`))
		})
		sameSet(t, "FAILED rows of tinyb", got, idStrings(tinyb))
	})

	t.Run("replay selected replays exactly the ticked rows", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/outbox?topic=tinyb"), chromedp.WaitVisible(chromedp.ID("failed")))
		picked := strings.Fields(b.eval(`Array.from(document.querySelectorAll('#failed input[name=id]')).slice(0, 3).map(e => { e.click(); return e.value }).join(' ')`))
		if len(picked) != 3 {
			t.Fatalf("ticked %v", picked)
		}
		b.do(chromedp.Click(chromedp.ID("replay-selected-submit")), chromedp.WaitVisible(chromedp.ID("confirm-count")))
		if got := b.text("#confirm-count"); got != "3" {
			t.Fatalf("confirmation count = %q, want 3", got)
		}
		b.do(chromedp.Click(chromedp.ID("confirm-replay")), chromedp.WaitVisible(chromedp.ID("flash")))
		if got := b.text("#flash"); !strings.Contains(got, "Replayed 3 of 3 selected rows") {
			t.Fatalf("flash = %q", got)
		}
		newIDs := idStrings(pgtest.Column[uuid.UUID](t, db.Pool, `SELECT id FROM bridge.outbox WHERE topic = 'tinyb' AND status = 'NEW'`))
		sameSet(t, "NEW rows of tinyb after replaying 3", newIDs, picked)
		f.lastAudit(t, audit.OutboxReplayIDs, 3)
	})

	t.Run("replay one row; the row page shows it failing again", func(t *testing.T) {
		b.t = t
		row := tinyb[len(tinyb)-1]
		b.do(chromedp.Navigate(base+"/ui/outbox/"+row.String()), chromedp.WaitVisible(chromedp.ID("replay-one")))
		b.do(chromedp.Click(chromedp.ID("replay-one")), chromedp.WaitVisible(chromedp.ID("flash")))
		if got := b.text("#flash"); !strings.Contains(got, "Replayed 1 of 1 selected row ") {
			t.Fatalf("flash = %q", got)
		}
		if n := f.outboxCount(t, "tinyb", "FAILED"); n != 126 {
			t.Fatalf("tinyb: %d FAILED, want 126", n)
		}
		f.lastAudit(t, audit.OutboxReplayIDs, 1)
		// No relay runs here: park it again as a relay would, and the live
		// status says it failed again, when.
		if _, err := db.Pool.Exec(ctx, `UPDATE bridge.outbox SET status = 'FAILED', failed_at = now(), attempts = 10 WHERE id = $1`, row); err != nil {
			t.Fatal(err)
		}
		b.waitText("#failed-at", "failed again")
		b.do(chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("row-status")))
		if n := len(f.audited(t, audit.OutboxReplayIDs)); n != 2 {
			t.Fatalf("after a reload the audit log holds %d selected replays, want 2", n)
		}
	})

	t.Run("an ESC character in an error is shown as \\x1b", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/outbox/"+esc[0].String()), chromedp.WaitVisible(chromedp.ID("last-error")))
		if got := b.text("#last-error"); !strings.Contains(got, `colour \x1b[31mred\x1b[0m`) {
			t.Fatalf("last error = %q", got)
		}
	})

	t.Run("replay all that match an error text, across topics", func(t *testing.T) {
		b.t = t
		want := f.outboxCount(t, "tinyb", "FAILED")
		b.do(chromedp.Navigate(base+"/ui/outbox"), chromedp.WaitVisible(chromedp.ID("filters")),
			chromedp.SendKeys(chromedp.CSS(`#filters input[name=error]`), "TOO LARGE"), chromedp.Submit(chromedp.CSS(`#filters input[name=error]`)))
		// The unfiltered page has a replay-all button too: wait for the
		// filtered page before taking its button.
		b.waitLoaded("error=TOO+LARGE")
		b.do(chromedp.WaitVisible(chromedp.ID("replay-all")))
		b.do(chromedp.Click(chromedp.ID("replay-all")), chromedp.WaitVisible(chromedp.ID("confirm-count")))
		if got := b.text("#confirm-count"); got != strconv.FormatInt(want, 10) {
			t.Fatalf("confirmation count = %q, want the %d FAILED rows of tinyb", got, want)
		}
		b.do(chromedp.Click(chromedp.ID("confirm-replay")), chromedp.WaitVisible(chromedp.ID("flash")))
		if n := f.outboxCount(t, "tinyb", "FAILED"); n != 0 {
			t.Fatalf("tinyb: %d FAILED left", n)
		}
		if n := f.outboxCount(t, "tinyesc", "FAILED"); n != 1 {
			t.Fatalf("tinyesc (another error): %d FAILED, want 1 untouched", n)
		}
		if e := f.lastAudit(t, audit.OutboxReplayMatching, want); e.Scope != "error=TOO LARGE" {
			t.Fatalf("audit scope = %q", e.Scope)
		}
	})

	t.Run("the NEW and SENT views page through every row once", func(t *testing.T) {
		b.t = t
		rowIDs := func() []string {
			return strings.Fields(b.eval(`Array.from(document.querySelectorAll('#rows a[href^="/ui/outbox/"]')).map(e => e.getAttribute("href").slice(11)).join(' ')`))
		}
		sameSet(t, "NEW rows of tinynew", collectPages(b, "/ui/outbox?status=NEW&topic=tinynew", "rows", rowIDs), idStrings(tinynew))
		b.do(chromedp.Navigate(base+"/ui/outbox?status=NEW&topic=tinynew"), chromedp.WaitVisible(chromedp.ID("rows")))
		b.shot("outbox-new")
		sameSet(t, "SENT rows of tinysent", collectPages(b, "/ui/outbox?status=SENT&topic=tinysent", "rows", rowIDs), idStrings(tinysent))
	})

	var subID string
	var otherSub *store.Subscription
	subs := store.NewSubscriptionStore(db.Pool, true, time.Hour)
	t.Run("create: the secret is shown once and a reload creates nothing", func(t *testing.T) {
		b.t = t
		u := "http://127.0.0.1:9/other"
		var err error
		if otherSub, err = subs.Create(ctx, store.SubscriptionInput{URL: &u, EventTypes: []string{"*"}}); err != nil {
			t.Fatal(err)
		}
		b.do(chromedp.Navigate(base+"/ui/subscriptions"), chromedp.WaitVisible(chromedp.ID("create")),
			chromedp.SendKeys(chromedp.CSS(`#create input[name=url]`), "http://127.0.0.1:9/hook"),
			chromedp.SendKeys(chromedp.CSS(`#create input[name=event_types]`), "asset.*"),
			chromedp.Click(chromedp.ID("create-submit")), chromedp.WaitVisible(chromedp.ID("secret")))
		secret := b.text("#secret")
		if !strings.HasPrefix(secret, "whsec_") {
			t.Fatalf("secret = %q", secret)
		}
		subID = strings.TrimSuffix(strings.TrimPrefix(b.eval(`location.pathname`), "/ui/subscriptions/"), "/secret")
		if n := f.count(t, `SELECT count(*) FROM bridge.subscriptions`); n != 2 {
			t.Fatalf("%d subscriptions, want 2", n)
		}
		b.do(chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("secret-gone")))
		if strings.Contains(b.html(), secret) {
			t.Fatal("the reloaded page shows the secret again")
		}
		if n := f.count(t, `SELECT count(*) FROM bridge.subscriptions`); n != 2 {
			t.Fatalf("after a reload: %d subscriptions, want 2 (the reload created one)", n)
		}
		if e := f.lastAudit(t, audit.SubscriptionCreate, 1); e.Target != subID {
			t.Fatalf("audit target %q, want %s", e.Target, subID)
		}
		b.do(chromedp.Navigate(base+"/ui/subscriptions"), chromedp.WaitVisible(chromedp.ID("sub-count")))
		if got := b.text("#sub-count"); got != "2 subscriptions." {
			t.Fatalf("count = %q", got)
		}
	})

	t.Run("rotate: one new secret, shown once; the other subscription untouched", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/subscriptions/"+subID), chromedp.WaitVisible(chromedp.ID("rotate")))
		if got := b.text("#secrets"); !strings.HasPrefix(got, "secret 1 created") {
			t.Fatalf("secrets = %q, want them numbered per subscription", got)
		}
		b.do(chromedp.Click(chromedp.ID("rotate")), chromedp.WaitVisible(chromedp.ID("grace")))
		secret := b.text("#secret")
		b.do(chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("secret-gone")))
		if strings.Contains(b.html(), secret) {
			t.Fatal("the reloaded page shows the rotated secret again")
		}
		if n := f.count(t, `SELECT count(*) FROM bridge.subscription_secrets WHERE subscription_id = $1`, subID); n != 2 {
			t.Fatalf("%d secrets after one rotation and a reload, want 2", n)
		}
		if n := f.count(t, `SELECT count(*) FROM bridge.subscription_secrets WHERE subscription_id = $1`, otherSub.ID); n != 1 {
			t.Fatalf("the other subscription has %d secrets, want 1", n)
		}
		f.lastAudit(t, audit.SubscriptionRotate, 1)
	})

	t.Run("disable and enable act on one subscription", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/subscriptions/"+subID), chromedp.WaitVisible(chromedp.ID("disable")),
			chromedp.SendKeys(chromedp.ID("disable-reason"), "maintenance"), chromedp.Click(chromedp.ID("disable")),
			chromedp.WaitVisible(chromedp.ID("enable")))
		enabled := func(id string) bool {
			s, err := subs.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			return s.Enabled
		}
		if enabled(subID) || !enabled(otherSub.ID) {
			t.Fatalf("after disable: %v / other %v, want false / true", enabled(subID), enabled(otherSub.ID))
		}
		f.lastAudit(t, audit.SubscriptionDisable, 1)
		b.do(chromedp.Click(chromedp.ID("enable")), chromedp.WaitVisible(chromedp.ID("disable")))
		if !enabled(subID) {
			t.Fatal("enable left it disabled")
		}
		f.lastAudit(t, audit.SubscriptionEnable, 1)
		b.do(chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("disable")))
		if n := len(f.audited(t, audit.SubscriptionEnable)); n != 1 {
			t.Fatalf("after a reload: %d enables audited, want 1", n)
		}
	})

	t.Run("a test event queues one delivery to that subscription", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/subscriptions/"+subID), chromedp.WaitVisible(chromedp.ID("send-test")),
			chromedp.Click(chromedp.ID("send-test")), chromedp.WaitVisible(chromedp.ID("status")))
		b.do(chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("status")))
		if n := f.count(t, `SELECT count(*) FROM bridge.deliveries WHERE subscription_id = $1 AND event_type = 'bridge.test'`, subID); n != 1 {
			t.Fatalf("%d test deliveries after a send and a reload, want 1", n)
		}
		if n := f.count(t, `SELECT count(*) FROM bridge.deliveries WHERE subscription_id = $1`, otherSub.ID); n != 0 {
			t.Fatalf("the other subscription got %d deliveries", n)
		}
		f.lastAudit(t, audit.SubscriptionTest, 1)
		// The page is live while the delivery waits.
		if !b.exists(`#delivery-live[hx-get]`) {
			t.Fatal("a pending delivery's page does not update itself")
		}
		if got := b.text("#next-attempt"); !strings.HasPrefix(got, "now (due ") && !strings.HasPrefix(got, "in ") {
			t.Fatalf("next attempt = %q", got)
		}
		// Delivered meanwhile (no deliverer runs here: as one would mark
		// it): the open page shows it without a reload.
		if _, err := db.Pool.Exec(ctx, `UPDATE bridge.deliveries SET status = 'delivered', delivered_at = now(), attempts = 1
			WHERE subscription_id = $1 AND event_type = 'bridge.test'`, subID); err != nil {
			t.Fatal(err)
		}
		b.waitText("#status", "delivered")
		eventID := b.text("#event-id")
		b.do(chromedp.Navigate(base+"/ui/search?q="+eventID), chromedp.WaitVisible(chromedp.ID("event-id")))
		if got := b.text("#event-id"); got != eventID {
			t.Fatalf("search by webhook-id landed on event %q", got)
		}
	})

	// Deliveries: 120 of sub S (60 dead: 30 created 3 hours ago, then 30
	// now; 60 delivered) and 5 dead of the other subscription (3 old, 2
	// new).
	insert := func(sub string, n int, status string, age time.Duration) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `
			INSERT INTO bridge.deliveries (subscription_id, event_id, event_type, topic, asset_id, payload, event_created_at, status,
			  attempts, created_at, dead_at, delivered_at, last_error)
			SELECT $1, gen_random_uuid()::text, 'asset.changed', 't', 'a-' || (i % 5), '{}', now(), $3,
			  2, now() - $4::interval, CASE WHEN $3 = 'dead' THEN now() END, CASE WHEN $3 = 'delivered' THEN now() END,
			  CASE WHEN $3 = 'dead' THEN 'HTTP 500' END
			FROM generate_series(1, $2) i`, sub, n, status, fmt.Sprintf("%d seconds", int(age.Seconds()))); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("the deliveries list pages through every delivery once", func(t *testing.T) {
		b.t = t
		insert(subID, 30, "dead", 3*time.Hour)
		insert(subID, 60, "delivered", 0)
		insert(subID, 30, "dead", 0)
		insert(otherSub.ID, 3, "dead", 3*time.Hour)
		insert(otherSub.ID, 2, "dead", 0)
		got := collectPages(b, "/ui/deliveries?subscription="+subID, "deliveries", func() []string {
			return strings.Fields(b.eval(`Array.from(document.querySelectorAll('#deliveries a[href^="/ui/deliveries/"]')).map(e => e.textContent).join(' ')`))
		})
		sameSet(t, "deliveries of the subscription", got, idStrings(pgtest.Column[int64](t, db.Pool, `SELECT id FROM bridge.deliveries WHERE subscription_id = $1`, subID)))
	})

	t.Run("revive one and revive selected", func(t *testing.T) {
		b.t = t
		dead := pgtest.Column[int64](t, db.Pool, `SELECT id FROM bridge.deliveries WHERE subscription_id = $1 AND status = 'dead' ORDER BY id`, subID)
		b.do(chromedp.Navigate(base+"/ui/deliveries/"+strconv.FormatInt(dead[0], 10)), chromedp.WaitVisible(chromedp.ID("revive-one")),
			chromedp.Click(chromedp.ID("revive-one")), chromedp.WaitVisible(chromedp.ID("flash")))
		if got := b.text("#flash"); !strings.Contains(got, "Revived 1 of 1 selected delivery ") {
			t.Fatalf("flash = %q", got)
		}
		if got := pgtest.Column[int64](t, db.Pool, `SELECT id FROM bridge.deliveries WHERE subscription_id = $1 AND status = 'pending' AND event_type <> 'bridge.test'`, subID); !slices.Equal(got, dead[:1]) {
			t.Fatalf("pending after reviving %d: %v", dead[0], got)
		}
		f.lastAudit(t, audit.DeliveriesRevive, 1)
		b.do(chromedp.Navigate(base+"/ui/deliveries?status=dead&subscription="+subID), chromedp.WaitVisible(chromedp.ID("deliveries")))
		picked := strings.Fields(b.eval(`Array.from(document.querySelectorAll('#deliveries input[name=id]')).slice(0, 2).map(e => { e.click(); return e.value }).join(' ')`))
		b.do(chromedp.Click(chromedp.ID("revive-selected-submit")), chromedp.WaitVisible(chromedp.ID("confirm-count")))
		if got := b.text("#confirm-count"); got != "2" {
			t.Fatalf("confirmation count = %q, want 2", got)
		}
		b.do(chromedp.Click(chromedp.ID("confirm-revive")), chromedp.WaitVisible(chromedp.ID("flash")))
		want := append(idStrings(dead[:1]), picked...)
		sameSet(t, "pending after reviving 2 more", idStrings(pgtest.Column[int64](t, db.Pool,
			`SELECT id FROM bridge.deliveries WHERE subscription_id = $1 AND status = 'pending' AND event_type <> 'bridge.test'`, subID)), want)
		f.lastAudit(t, audit.DeliveriesRevive, 2)
		if n := f.deliveryCount(t, otherSub.ID, "dead"); n != 5 {
			t.Fatalf("the other subscription: %d dead, want 5", n)
		}
	})

	t.Run("recover since a time revives that window's dead only", func(t *testing.T) {
		b.t = t
		recent := f.count(t, `SELECT count(*) FROM bridge.deliveries WHERE subscription_id = $1 AND status = 'dead' AND created_at > now() - interval '1 hour'`, subID)
		old := f.count(t, `SELECT count(*) FROM bridge.deliveries WHERE subscription_id = $1 AND status = 'dead' AND created_at < now() - interval '1 hour'`, subID)
		if recent != 28 || old != 29 {
			t.Fatalf("fixture: %d recent dead, %d old dead, want 28 and 29", recent, old)
		}
		b.do(chromedp.Navigate(base+"/ui/subscriptions/"+subID), chromedp.WaitVisible(chromedp.ID("recover-since")),
			chromedp.SendKeys(chromedp.ID("recover-since"), "1h"), chromedp.Click(chromedp.ID("recover-submit")),
			chromedp.WaitVisible(chromedp.ID("confirm-count")))
		b.shot("recover")
		if got := b.text("#confirm-count"); got != strconv.FormatInt(recent, 10) {
			t.Fatalf("confirmation count = %q, want %d", got, recent)
		}
		b.do(chromedp.Click(chromedp.ID("confirm-revive")), chromedp.WaitVisible(chromedp.ID("flash")))
		if got := b.text("#flash"); !strings.Contains(got, fmt.Sprintf("Recovered %d dead deliveries", recent)) {
			t.Fatalf("flash = %q", got)
		}
		if n := f.count(t, `SELECT count(*) FROM bridge.deliveries WHERE subscription_id = $1 AND status = 'dead' AND created_at > now() - interval '1 hour'`, subID); n != 0 {
			t.Fatalf("%d recent dead left", n)
		}
		if n := f.deliveryCount(t, subID, "dead"); n != old {
			t.Fatalf("%d dead left, want the %d older than the window", n, old)
		}
		if n := f.deliveryCount(t, otherSub.ID, "dead"); n != 5 {
			t.Fatalf("the other subscription: %d dead, want 5", n)
		}
		f.lastAudit(t, audit.DeliveriesRecover, recent)
		b.do(chromedp.Reload())
		if n := len(f.audited(t, audit.DeliveriesRecover)); n != 1 {
			t.Fatalf("after a reload: %d recovers audited, want 1", n)
		}
	})

	t.Run("revive the dead that match a filter (subscription and creation window)", func(t *testing.T) {
		b.t = t
		from := time.Now().UTC().Add(-2 * time.Hour).Format("2006-01-02T15:04")
		b.do(chromedp.Navigate(base+"/ui/deliveries?status=dead&subscription="+otherSub.ID+"&from="+from), chromedp.WaitVisible(chromedp.ID("revive-matching")),
			chromedp.Click(chromedp.ID("revive-matching")), chromedp.WaitVisible(chromedp.ID("confirm-count")))
		if got := b.text("#confirm-count"); got != "2" {
			t.Fatalf("confirmation count = %q, want the 2 created in the window", got)
		}
		b.do(chromedp.Click(chromedp.ID("confirm-revive")), chromedp.WaitVisible(chromedp.ID("flash")))
		if d, p := f.deliveryCount(t, otherSub.ID, "dead"), f.deliveryCount(t, otherSub.ID, "pending"); d != 3 || p != 2 {
			t.Fatalf("other subscription: %d dead, %d pending; want 3 and 2", d, p)
		}
		f.lastAudit(t, audit.DeliveriesRecover, 2)
		// With an asset in the filter the list is narrower than any revive
		// statement: no button, a note.
		b.do(chromedp.Navigate(base+"/ui/deliveries?status=dead&asset=a-1&subscription="+otherSub.ID), chromedp.WaitVisible(chromedp.ID("revive-note")))
		if b.exists("#revive-matching") {
			t.Fatal("revive-all offered for a filter it cannot honour")
		}
	})

	t.Run("revive all dead of a subscription", func(t *testing.T) {
		b.t = t
		dead := f.deliveryCount(t, subID, "dead")
		b.do(chromedp.Navigate(base+"/ui/subscriptions/"+subID), chromedp.WaitVisible(chromedp.ID("revive-all")),
			chromedp.Click(chromedp.ID("revive-all")), chromedp.WaitVisible(chromedp.ID("confirm-count")))
		if got := b.text("#confirm-count"); got != strconv.FormatInt(dead, 10) {
			t.Fatalf("confirmation count = %q, want %d", got, dead)
		}
		b.do(chromedp.Click(chromedp.ID("confirm-revive")), chromedp.WaitVisible(chromedp.ID("flash")))
		if n := f.deliveryCount(t, subID, "dead"); n != 0 {
			t.Fatalf("%d dead left", n)
		}
		if n := f.deliveryCount(t, otherSub.ID, "dead"); n != 3 {
			t.Fatalf("the other subscription: %d dead, want 3", n)
		}
		f.lastAudit(t, audit.DeliveriesReviveSub, dead)
		// The stream page follows its stream without a reload.
		b.do(chromedp.Navigate(base+"/ui/streams?subscription="+subID+"&asset=a-1"), chromedp.WaitVisible(chromedp.ID("stream-live")))
		if got := b.text("#open"); got == "0" {
			t.Fatal("the revived stream a-1 shows nothing open")
		}
		if _, err := db.Pool.Exec(ctx, `UPDATE bridge.deliveries SET status = 'delivered', delivered_at = now()
			WHERE subscription_id = $1 AND asset_id = 'a-1' AND status IN ('pending', 'delivering')`, subID); err != nil {
			t.Fatal(err)
		}
		b.eventually(30*time.Second, func() string {
			if got := b.text("#open"); got != "0" {
				return "the stream page still shows " + got + " open"
			}
			return ""
		})
	})

	t.Run("search by id", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/search?q="+tinyb[5].String()), chromedp.WaitVisible(chromedp.ID("row-status")))
		if got := b.eval(`location.pathname`); got != "/ui/outbox/"+tinyb[5].String() {
			t.Fatalf("search by outbox id landed on %s", got)
		}
		b.do(chromedp.Navigate(base+"/ui/search?q=no-such-id"), chromedp.WaitVisible(chromedp.ID("no-hits")))
	})

	t.Run("delete needs the typed confirmation and deletes one subscription", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/subscriptions/"+subID), chromedp.WaitVisible(chromedp.ID("delete-confirm")),
			chromedp.SetAttributeValue(chromedp.ID("delete-confirm"), "pattern", ".*"),
			chromedp.SendKeys(chromedp.ID("delete-confirm"), "nope"), chromedp.Click(chromedp.ID("delete")),
			chromedp.WaitVisible(chromedp.ID("error")))
		if n := f.count(t, `SELECT count(*) FROM bridge.subscriptions`); n != 2 {
			t.Fatalf("a wrong confirmation: %d subscriptions left, want 2", n)
		}
		b.do(chromedp.Navigate(base+"/ui/subscriptions/"+subID), chromedp.WaitVisible(chromedp.ID("delete-confirm")),
			chromedp.SendKeys(chromedp.ID("delete-confirm"), subID[:8]), chromedp.Click(chromedp.ID("delete")),
			chromedp.WaitVisible(chromedp.ID("flash")))
		if got := pgtest.Column[string](t, db.Pool, `SELECT id::text FROM bridge.subscriptions`); !slices.Equal(got, []string{otherSub.ID}) {
			t.Fatalf("subscriptions after delete: %v, want only %s", got, otherSub.ID)
		}
		f.lastAudit(t, audit.SubscriptionDelete, 1)
	})

	t.Run("the audit log lists every action and pages", func(t *testing.T) {
		b.t = t
		b.do(chromedp.Navigate(base+"/ui/audit"), chromedp.WaitVisible(chromedp.ID("audit")))
		b.shot("audit")
		page := b.text("#audit")
		for _, a := range []string{audit.SubscriptionDelete, audit.DeliveriesReviveSub, audit.DeliveriesRecover, audit.DeliveriesRevive,
			audit.SubscriptionTest, audit.SubscriptionEnable, audit.SubscriptionDisable, audit.SubscriptionRotate, audit.SubscriptionCreate,
			audit.OutboxReplayIDs, audit.OutboxReplayMatching} {
			if !strings.Contains(page, a) {
				t.Errorf("the audit page does not list %s", a)
			}
		}
		if strings.Contains(page, "whsec_") {
			t.Fatal("the audit log shows a secret")
		}
		got := collectPages(b, "/ui/audit", "audit", func() []string {
			return strings.Fields(b.eval(`Array.from(document.querySelectorAll('#audit tbody tr[data-id]')).map(e => e.dataset.id).join(' ')`))
		})
		sameSet(t, "audit log", got, idStrings(pgtest.Column[int64](t, db.Pool, `SELECT id FROM bridge.audit_log`)))
	})

	t.Run("favicon", func(t *testing.T) {
		res, err := http.Get(base + "/favicon.ico")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "image/x-icon" || len(body) < 22 || body[2] != 1 {
			t.Fatalf("GET /favicon.ico: %d %s, %d bytes", res.StatusCode, res.Header.Get("Content-Type"), len(body))
		}
	})
}
