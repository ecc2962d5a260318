package console_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/consumer"
	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/logging"
	"github.com/outboxbridge/bridge/internal/relay"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/internal/tracing"
)

// browser is one tab and the test driving it.
type browser struct {
	t     *testing.T
	ctx   context.Context
	base  string
	shots string
}

// do runs steps with a bound, failing the test with the page it was on.
func (b *browser) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.fatal(err)
	}
}

func (b *browser) fatal(err error) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
	defer cancel()
	loc, _ := chromedp.Run(ctx, chromedp.Location())
	body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	b.t.Fatalf("browser at %s: %v\npage text:\n%s", loc, err, body)
}

func evalIn[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.fatal(err)
	}
	return v
}

func (b *browser) eval(expr string) string { return evalIn[string](b, expr) }

func (b *browser) num(expr string) int { return evalIn[int](b, expr) }

// text is the innerText of the first element matching sel ("" if none).
func (b *browser) text(sel string) string {
	b.t.Helper()
	return strings.TrimSpace(b.eval(fmt.Sprintf(`(function(){var e=document.querySelector(%q);return e?e.innerText:""})()`, sel)))
}

func (b *browser) count(sel string) int {
	b.t.Helper()
	return b.num(fmt.Sprintf(`document.querySelectorAll(%q).length`, sel))
}

func (b *browser) exists(sel string) bool { return b.count(sel) > 0 }

func (b *browser) html() string {
	b.t.Helper()
	return b.eval(`document.documentElement.outerHTML`)
}

func (b *browser) cookies() map[string]*network.Cookie {
	b.t.Helper()
	res, err := chromedp.Call(b.ctx, network.GetCookies, network.GetCookiesParams{})
	if err != nil {
		b.fatal(err)
	}
	out := map[string]*network.Cookie{}
	for _, c := range res.Cookies {
		out[c.Name] = c
	}
	return out
}

// waitText waits until sel's text contains want (the page may update
// itself meanwhile).
func (b *browser) waitText(sel, want string) {
	b.t.Helper()
	b.eventually(90*time.Second, func() string {
		if got := b.text(sel); !strings.Contains(got, want) {
			return fmt.Sprintf("%s shows %q, want it to contain %q", sel, got, want)
		}
		return ""
	})
}

// waitLoaded waits until the page the browser shows is a loaded document
// whose address contains part: after a form's submit the old page stays in
// place until the new one commits, and a wait for an element both pages
// have would find the old page's, which the navigation then destroys.
func (b *browser) waitLoaded(part string) {
	b.t.Helper()
	b.eventually(60*time.Second, func() string {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		defer cancel()
		// A page in the middle of its navigation may refuse the script: that
		// is not yet loaded, not a failure.
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.readyState + " " + location.href`))
		if err != nil {
			return fmt.Sprintf("page not readable yet: %v", err)
		}
		if !strings.HasPrefix(v, "complete ") || !strings.Contains(v, part) {
			return fmt.Sprintf("page is %q, want a loaded page whose address contains %q", v, part)
		}
		return ""
	})
}

// eventually polls cond every 200ms (each poll is a browser round trip)
// until it returns "", giving up at once if the browser has gone.
func (b *browser) eventually(timeout time.Duration, cond func() string) {
	b.t.Helper()
	testkit.EventuallyEvery(b.ctx, b.t, timeout, 200*time.Millisecond, cond)
}

// documented is every screenshot in docs/console/ and the elements its page
// must show, as docs/console.md describes them: shot fails when a page no
// longer renders one, so a screenshot cannot go stale silently, and
// TestScreenshotsDocumented fails when docs/console/ holds a picture no
// test takes.
var documented = map[string][]string{
	"login":          {"#token", "#signin"},
	"overview":       {"#failed-card", "#topics", "#subs", "svg.chart", "#search"},
	"overview-phone": {"#failed-card", "#topics"},
	"outbox":         {"#status-tabs", "#filters", "#failed-total", "#replay-all", "#failed", "#replay-selected"},
	"outbox-new":     {"#status-tabs", "#view-total", "#rows"},
	"outbox-row":     {"#row-status", "#status", "#headers", "#payload", "#trace-link"},
	"subscriptions":  {"#sub-count", "#subscriptions", "#create"},
	"subscription":   {"#state", "#secrets", "#send-test", "#rotate", "#disable", "#sub-charts svg.chart", "#recover-form", "#edit", "#delete-form"},
	"rotate":         {"#secret", "#copy", "#grace"},
	"deliveries":     {"#filters", "#deliveries", "#revive-selected"},
	"delivery":       {"#status", "#attempts", "#revive-one"},
	"stream":         {"#stream-live", "#open", "#stream"},
	"trace":          {"#waterfall", "#gaps"},
	"recover":        {"#confirm-text", "#confirm-count", "#confirm-revive"},
	"audit":          {"#audit", "#next"},
}

// shot checks that the current page renders what documented says about
// name and saves a full-page PNG of it as <name>.png.
func (b *browser) shot(name string) {
	b.t.Helper()
	want, ok := documented[name]
	if !ok {
		b.t.Fatalf("screenshot %q is not in documented", name)
	}
	for _, sel := range want {
		if !b.exists(sel) {
			b.fatal(fmt.Errorf("the %s page no longer renders %s, which its screenshot documents", name, sel))
		}
	}
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.shots, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

func kafkaConfig(brokers []string) config.Kafka {
	return config.Kafka{Brokers: brokers, ClientID: "console-test"}
}

// startPipeline runs a relay, a consumer and a deliverer on pool until the
// test ends.
func startPipeline(t *testing.T, ctx context.Context, pool *pgxpool.Pool, brokers []string, topic, group string, relayTP, consumeTP, deliverTP *tracing.Provider) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	rcfg := relay.Config{Logger: logging.New(t.Output(), "warn", "text"), TracerProvider: relayTP, PollInterval: 50 * time.Millisecond, BackoffBase: 50 * time.Millisecond,
		BackoffMax: 500 * time.Millisecond, LeaseTimeout: 2 * time.Second, ProduceTimeout: 5 * time.Second}
	client, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, relay.ProducerOptions(rcfg)...)...)
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(pool, []kgo.Opt{kgo.SeedBrokers(brokers...)}, consumer.Config{
		Group: group, Topics: []string{topic}, TracerProvider: consumeTP, RetryBackoff: 20 * time.Millisecond,
		Logger: logging.New(t.Output(), "warn", "text")})
	if err != nil {
		t.Fatal(err)
	}
	d, err := delivery.NewDeliverer(pool, delivery.Config{
		RetrySchedule:  []time.Duration{0, 50 * time.Millisecond}, // two attempts, then dead
		PollInterval:   50 * time.Millisecond,
		AllowedCIDRs:   []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		TracerProvider: deliverTP,
		Timeout:        5 * time.Second,
		Logger:         logging.New(t.Output(), "warn", "text"),
	})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		defer client.Close()
		if err := relay.New(pool, client, rcfg).Run(ctx); err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			t.Errorf("consumer: %v", err)
		}
	})
	wg.Go(func() {
		if err := d.Run(ctx); err != nil {
			t.Errorf("deliverer: %v", err)
		}
	})
}

// loopback lets the tests' subscriptions point at 127.0.0.1, the way
// WEBHOOK_ALLOWED_CIDRS does for a bridge whose receivers run on loopback;
// without it the console refuses a literal loopback address at create.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
