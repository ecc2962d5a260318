package console

import (
	"bytes"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/jaegerquery"
)

// page is what every template sees.
type page struct {
	Title    string
	Nav      string
	SignedIn bool
	CSRF     string
	Flash    string
	D        map[string]any
}

func parsePages() (map[string]*template.Template, error) {
	layout, err := fs.ReadFile(templateFS, "templates/layout.html")
	if err != nil {
		return nil, err
	}
	files, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, f := range files {
		name := strings.TrimSuffix(path.Base(f), ".html")
		if name == "layout" {
			continue
		}
		body, err := fs.ReadFile(templateFS, f)
		if err != nil {
			return nil, err
		}
		t, err := template.New("layout").Funcs(funcs).Parse(string(layout))
		if err == nil {
			_, err = t.Parse(string(body))
		}
		if err != nil {
			return nil, fmt.Errorf("console template %s: %w", f, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// render executes a page into a buffer first, so a template error is a 500
// and never half a page.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data map[string]any) {
	p := page{Title: title, Nav: navOf(name), D: data}
	if s := sessionFrom(r.Context()); s != nil {
		p.SignedIn, p.CSRF, p.Flash = true, s.csrf, c.takeFlash(s)
	}
	c.renderPage(w, r, status, name, p)
}

func (c *Console) renderPage(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	t, ok := c.pages[name]
	if !ok {
		http.Error(w, "no template "+name, http.StatusInternalServerError)
		return
	}
	tpl := "layout"
	if r.Header.Get("HX-Request") == "true" && t.Lookup("fragment") != nil {
		tpl = "fragment"
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, tpl, p); err != nil {
		c.log.ErrorContext(r.Context(), "console template failed", "page", name, "error", err)
		http.Error(w, "internal error (logged by the bridge)", http.StatusInternalServerError)
		return
	}
	w.Header().Set(contract.HeaderContentType, "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func navOf(name string) string {
	switch {
	case strings.HasPrefix(name, "outbox"):
		return "outbox"
	case strings.HasPrefix(name, "subscription"):
		return "subscriptions"
	case strings.HasPrefix(name, "deliver"), name == "stream", name == "revive":
		return "deliveries"
	case name == "trace":
		return "trace"
	case name == "audit":
		return "audit"
	}
	return "overview"
}

var funcs = template.FuncMap{
	"ts": func(t any) string {
		switch v := t.(type) {
		case time.Time:
			if v.IsZero() {
				return "—"
			}
			return v.UTC().Format("2006-01-02 15:04:05Z")
		case *time.Time:
			if v == nil || v.IsZero() {
				return "—"
			}
			return v.UTC().Format("2006-01-02 15:04:05Z")
		}
		return "—"
	},
	"ago": func(t any) string {
		var tm time.Time
		switch v := t.(type) {
		case time.Time:
			tm = v
		case *time.Time:
			if v == nil {
				return "—"
			}
			tm = *v
		}
		if tm.IsZero() {
			return "—"
		}
		d := time.Since(tm)
		if d < 0 {
			return "in " + human(-d)
		}
		return human(d) + " ago"
	},
	"secs": func(s float64) string { return human(time.Duration(s * float64(time.Second))) },
	"ms":   func(s float64) string { return jaegerquery.Round(time.Duration(s * float64(time.Second))) },
	"dur":  func(d time.Duration) string { return jaegerquery.Round(d) },
	"msf":  func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) + " ms" },
	"num":  func(n any) string { return group(toInt64(n)) },
	"plural": func(n any, one, many string) string {
		v := toInt64(n)
		if v == 1 {
			return "1 " + one
		}
		return group(v) + " " + many
	},
	"due":     due,
	"age":     func(t time.Time) string { return human(time.Since(t)) },
	"now":     func() string { return time.Now().UTC().Format("15:04:05Z") },
	"visible": visible,
	"offset": func(n int64) string {
		if n < 0 {
			return "—"
		}
		return group(n)
	},
	"href":  href,
	"rate":  func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) + "/s" },
	"short": func(s string) string { return s[:min(8, len(s))] },
	"str": func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	},
	"code": func(p *int) string {
		if p == nil {
			return "—"
		}
		return strconv.Itoa(*p)
	},
	"pct": func(f float64) string {
		if f < 0 {
			return "—"
		}
		return strconv.FormatFloat(100*f, 'f', 1, 64) + "%"
	},
	"traceID":  jaegerquery.TraceIDOf,
	"spanName": spanName,
	"join":     strings.Join,
	"query":    func(base string, kv ...string) template.URL { return href(base, nil, kv...) },
	"spark":    sparkline,
	"add":      func(a, b int) int { return a + b },
	"divf":     func(n int64, d float64) float64 { return float64(n) / d },
	"bar": func(off, d, total time.Duration) [2]string {
		if total <= 0 {
			return [2]string{"0", "100"}
		}
		x := 100 * float64(off) / float64(total)
		w := max(100*float64(d)/float64(total), 0.3)
		return [2]string{strconv.FormatFloat(x, 'f', 2, 64), strconv.FormatFloat(min(w, 100-x+0.3), 'f', 2, 64)}
	},
	"indent": func(depth int) int { return 8 + 14*depth },
}

func human(d time.Duration) string {
	switch {
	case d < time.Second:
		return strconv.Itoa(int(d.Milliseconds())) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func group(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// sparkline is an SVG polyline's points for values on a w×h box (the last
// value at the right edge), scaled to the series' maximum.
func sparkline(values []float64, w, h float64) string {
	if len(values) == 0 {
		return ""
	}
	hi := 0.0
	for _, v := range values {
		hi = max(hi, v)
	}
	if hi == 0 {
		hi = 1
	}
	var b strings.Builder
	n := len(values)
	for i, v := range values {
		x := w
		if n > 1 {
			x = w * float64(i) / float64(n-1)
		}
		y := h - 1 - (h-2)*v/hi
		fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
	}
	return strings.TrimSpace(b.String())
}

// link is base with the query q, where each key/value pair of kv replaces
// q's value for that key (an empty value removes the key). It is the one
// way the console builds a URL with a query: from url.Values, encoded once.
func link(base string, q url.Values, kv ...string) string {
	n := url.Values{}
	for k, v := range q {
		n[k] = append([]string(nil), v...)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			n.Del(kv[i])
		} else {
			n.Set(kv[i], kv[i+1])
		}
	}
	if len(n) == 0 {
		return base
	}
	return base + "?" + n.Encode()
}

// href is link for a template: a template.URL, so that html/template does
// not escape it a second time. Written as "/ui/outbox?{{.Q.Encode}}", the
// query would be escaped as one query value ("topic%3dtinya") and the
// filter lost: the page would then act on every row instead of the
// filtered ones. The base is a constant path of the console, and the query
// is encoded by url.Values, so nothing in it can start a script.
func href(base string, q url.Values, kv ...string) template.URL {
	return template.URL(link(base, q, kv...)) //nolint:gosec // see above
}

func toInt64(n any) int64 {
	switch v := n.(type) {
	case int:
		return int64(v)
	case int32:
		return int64(v)
	case int64:
		return v
	case uint:
		return int64(v)
	case *int64:
		if v != nil {
			return *v
		}
	}
	return 0
}

// due says when a scheduled time comes: "in 3.0s", or "now (due 12ms ago)"
// for a time already past (a pending delivery whose next attempt is due
// waits for a deliverer, not for the clock).
func due(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := time.Until(t)
	if d > 0 {
		return "in " + human(d)
	}
	return "now (due " + human(-d) + " ago)"
}

// visible shows the control characters of text an application or a
// subscriber wrote as escapes (ESC as \x1b): a browser draws them as empty
// boxes or not at all, and an operator reading an error must see them.
// Newlines and tabs stay.
func visible(s string) string {
	if strings.IndexFunc(s, isHidden) < 0 {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isHidden(r) {
			if r < 0x100 {
				fmt.Fprintf(&b, "\\x%02x", r)
			} else {
				fmt.Fprintf(&b, "\\u%04x", r)
			}
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isHidden(r rune) bool {
	return r != '\n' && r != '\t' && (r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == utf8.RuneError ||
		r == 0x200b || r == 0x200e || r == 0x200f || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069))
}

func formatFloat1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// spanName is a span's name as the waterfall shows it. A webhook attempt's
// span is named "webhook POST <host:port>" (the span name stays low in
// cardinality); the waterfall adds what tells two attempts and two
// subscribers on one host apart: the URL's path (url.full, whose query the
// deliverer has already redacted), the attempt and the delivery id.
func spanName(s jaegerquery.Span) string {
	if !strings.HasPrefix(s.Name, "webhook POST") {
		return s.Name
	}
	name := s.Name
	attr := map[string]string{}
	for _, a := range s.Attrs {
		attr[a.Key] = a.Value
	}
	if u, err := url.Parse(attr["url.full"]); err == nil && u.Path != "" && u.Path != "/" {
		name += u.EscapedPath()
	}
	if v := attr["webhook.attempt"]; v != "" {
		name += " · attempt " + v
	}
	if v := attr["webhook.delivery_id"]; v != "" {
		name += " · delivery " + v
	}
	return name
}
