package console_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/adminapi"
	"github.com/outboxbridge/bridge/internal/console"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// TestSessionOverTLS: over TLS the session cookie is Secure as well as
// HttpOnly, SameSite=Strict and expiring; a session ends at its TTL and at
// sign-out (the old cookie is dead server-side, not only deleted in the
// browser); a polling fragment after the end asks htmx to go to the sign-in
// page; a POST without the CSRF token changes nothing.
func TestSessionOverTLS(t *testing.T) {
	db := pgtest.NewParallel(t)
	mux := http.NewServeMux()
	ui, err := console.Mount(mux, console.Config{Config: adminapi.Config{Token: token, Pool: db.Pool}, SessionTTL: 15 * time.Second, SampleEvery: time.Second})
	if err != nil || ui == nil {
		t.Fatalf("Mount: %v, %v", ui, err)
	}
	defer ui.Close()
	srv := httptest.NewTLSServer(mux)
	defer srv.Close()
	jar, _ := cookiejar.New(nil)
	client := srv.Client()
	client.Jar = jar
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the test server's own certificate

	get := func(path string, hx bool) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if hx {
			req.Header.Set("HX-Request", "true")
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res
	}
	if res := get("/ui/", false); res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/ui/login" {
		t.Fatalf("GET /ui/ signed out: %d %s", res.StatusCode, res.Header.Get("Location"))
	}
	res, err := client.PostForm(srv.URL+"/ui/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	set := res.Header.Get("Set-Cookie")
	for _, want := range []string{"bridge_console=", "Path=/ui/", "HttpOnly", "Secure", "SameSite=Strict", "Max-Age=15"} {
		if !strings.Contains(set, want) {
			t.Errorf("Set-Cookie %q lacks %s", set, want)
		}
	}
	if res := get("/ui/", false); res.StatusCode != http.StatusOK {
		t.Fatalf("GET /ui/ signed in: %d", res.StatusCode)
	}
	if csp := get("/ui/", false).Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Fatalf("CSP = %q", csp)
	}
	// No CSRF token: refused, and the session still works.
	res, err = client.PostForm(srv.URL+"/ui/logout", url.Values{})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("sign-out without CSRF: %d, want 403", res.StatusCode)
	}
	if res := get("/ui/outbox", false); res.StatusCode != http.StatusOK {
		t.Fatalf("after a refused POST the session is gone: %d", res.StatusCode)
	}
	// The TTL ends it; the polling fragment is sent to the sign-in page.
	testkit.Eventually(t, 60*time.Second, func() string {
		if res := get("/ui/overview/live", true); res.StatusCode != http.StatusUnauthorized || res.Header.Get("HX-Redirect") != "/ui/login" {
			return "the session outlives its TTL"
		}
		return ""
	})
	// Sign-out kills the session server-side: a copy of the cookie is dead.
	res, err = client.PostForm(srv.URL+"/ui/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	u, _ := url.Parse(srv.URL + "/ui/")
	old := jar.Cookies(u)
	body := getBody(t, client, srv.URL+"/ui/")
	csrf := between(body, `name="csrf" value="`, `"`)
	res, err = client.PostForm(srv.URL+"/ui/logout", url.Values{"csrf": {csrf}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	jar.SetCookies(u, old)
	if res := get("/ui/", false); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("the signed-out session's cookie still works: %d", res.StatusCode)
	}
}

func getBody(t *testing.T, c *http.Client, u string) string {
	t.Helper()
	res, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

func between(s, from, to string) string {
	_, rest, _ := strings.Cut(s, from)
	v, _, _ := strings.Cut(rest, to)
	return v
}
