package console

import (
	"bytes"
	"html/template"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/jaegerquery"
)

// TestLinksKeepTheirQuery: a link built by href keeps every filter field
// through html/template (a query pasted into the template as a string is
// escaped as one value, "topic%3dtinya", and the filter lost).
func TestLinksKeepTheirQuery(t *testing.T) {
	tpl := template.Must(template.New("t").Funcs(funcs).Parse(`<a href="{{href "/ui/outbox/replay" .Q}}">x</a><a href="{{href "/ui/outbox" .Q "after" "50"}}">n</a>`))
	var b bytes.Buffer
	q := url.Values{"topic": {"tinya"}, "error": {`a&b"<c>`}}
	if err := tpl.Execute(&b, map[string]any{"Q": q}); err != nil {
		t.Fatal(err)
	}
	want := `<a href="/ui/outbox/replay?error=a%26b%22%3Cc%3E&amp;topic=tinya">x</a><a href="/ui/outbox?after=50&amp;error=a%26b%22%3Cc%3E&amp;topic=tinya">n</a>`
	if b.String() != want {
		t.Fatalf("got  %s\nwant %s", b.String(), want)
	}
	if got := link("/ui/deliveries", url.Values{"after": {"9"}, "status": {"dead"}}, "after", ""); got != "/ui/deliveries?status=dead" {
		t.Fatalf("link without after = %s", got)
	}
}

func TestSmallWords(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{visible("a\x1b[31mb\tc\nd\x7f\u202e"), `a\x1b[31mb` + "\tc\nd" + `\x7f\u202e`},
		{plural(1, "subscription", "subscriptions"), "1 subscription"},
		{plural(int64(1200), "row", "rows"), "1,200 rows"},
		{plural(0, "attempt", "attempts"), "0 attempts"},
		{due(time.Now().Add(-12 * time.Millisecond))[:10], "now (due 1"},
		{due(time.Now().Add(time.Hour))[:3], "in "},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	if f := funcs["offset"].(func(int64) string); f(-1) != "—" || f(1234) != "1,234" {
		t.Errorf("offset(-1) = %q, offset(1234) = %q", f(-1), f(1234))
	}
	if !strings.HasPrefix(string(favicon()[:4]), "\x00\x00\x01\x00") {
		t.Error("favicon is not an ICO")
	}
}

func TestWebhookSpanName(t *testing.T) {
	s := jaegerquery.Span{Name: "webhook POST 127.0.0.1:8443", Attrs: []jaegerquery.Attr{
		{Key: "url.full", Value: "https://127.0.0.1:8443/hooks/orders?token=REDACTED"}, {Key: "webhook.attempt", Value: "2"}, {Key: "webhook.delivery_id", Value: "17"}}}
	if got := spanName(s); got != "webhook POST 127.0.0.1:8443/hooks/orders · attempt 2 · delivery 17" {
		t.Fatalf("spanName = %q", got)
	}
	if got := spanName(jaegerquery.Span{Name: "publish orders"}); got != "publish orders" {
		t.Fatalf("spanName = %q", got)
	}
}
