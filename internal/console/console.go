package console

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/adminapi"
	"github.com/outboxbridge/bridge/internal/audit"
	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/jaegerquery"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
	"github.com/outboxbridge/bridge/internal/opsserver"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config configures the console. It is the admin API's Config (the token,
// the pool, the subscription store's settings, the logger, which here also
// records sign-ins and sign-outs, and the wrong-token counter shared with
// the API's rejections, bridge_admin_auth_failures_total) and the console's
// own settings: the two are mounted side by side with the same token and the
// same store, so they are configured from one place.
type Config struct {
	adminapi.Config
	// JaegerQueryURL (JAEGER_QUERY_URL) is where trace pages read traces;
	// empty: trace ids are shown but not drawn.
	JaegerQueryURL string
	// JaegerUIURL (JAEGER_UI_URL), when set, adds a link to <url>/trace/<id>.
	JaegerUIURL string
	// Kafka, when it has brokers, lets the overview show the consumer
	// group's lag (ConsumerGroup).
	Kafka         config.Kafka
	ConsumerGroup string
	// SessionTTL: a session ends this long after sign-in. Default 8h.
	SessionTTL time.Duration
	// SampleEvery: the overview's figures are read this often. Default 5s.
	SampleEvery time.Duration
	// Deliveries is what the delivery pages read through; nil: the
	// PostgreSQL delivery store on Pool.
	Deliveries DeliveryReader
}

// FromConfig is the console's Config from the bridge configuration.
func FromConfig(cfg *config.Config, pool *pgxpool.Pool, logger *slog.Logger) Config {
	return Config{
		Config:         adminapi.FromConfig(cfg, pool, logger),
		JaegerQueryURL: cfg.HTTP.JaegerQueryURL,
		JaegerUIURL:    cfg.HTTP.JaegerUIURL,
		Kafka:          cfg.Kafka,
		ConsumerGroup:  cfg.Consumer.Group,
	}
}

// Mounter is what the console mounts on: *opsserver.Server, *http.ServeMux.
type Mounter interface {
	Handle(pattern string, h http.Handler)
}

// Console is the operator console under /ui/.
type Console struct {
	cfg        Config
	auth       *adminapi.Authenticator
	pool       *pgxpool.Pool
	subs       *store.SubscriptionStore
	deliveries DeliveryReader
	// actions is the delivery store the console's writes go through
	// (revive, recover, test event).
	actions *store.DeliveryStore
	// actor is the admin token's id in the audit log.
	actor   string
	jaeger  *jaegerquery.Client
	kafka   *kgo.Client
	log     *slog.Logger
	pages   map[string]*template.Template
	mux     *http.ServeMux
	sampler *sampler

	mu       sync.Mutex
	sessions map[string]*session
}

// session is one signed-in browser.
type session struct {
	csrf    string
	expires time.Time
	flash   string
	// handoff carries a secret from the POST that made it to the one page
	// that shows it (Post/Redirect/Get): taken once, within handoffTTL.
	handoff *secretHandoff
}

// secretHandoff is a signing secret on its way to the page that shows it.
type secretHandoff struct {
	sub     *store.Subscription
	created bool
	expires time.Time
}

// handoffTTL bounds how long a created or rotated secret waits in the
// session for its page: the redirect follows at once, so a minute is ample,
// and a secret never stays in memory longer than that.
const handoffTTL = time.Minute

// Mount mounts /ui/ on m when cfg.Token is set and starts the overview's
// sampler; it returns nil (and mounts nothing) without a token. Close stops
// the sampler.
func Mount(m Mounter, cfg Config) (*Console, error) {
	if m == nil || strings.TrimSpace(cfg.Token) == "" {
		return nil, nil
	}
	c, err := New(cfg)
	if err != nil {
		return nil, err
	}
	m.Handle("/ui/", c)
	m.Handle("GET /favicon.ico", http.HandlerFunc(serveFavicon))
	m.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusFound))
	c.log.Info("console mounted", "path", "/ui/", "jaeger_query_url", cfg.JaegerQueryURL)
	return c, nil
}

// New builds the console (Mount is New + mounting).
func New(cfg Config) (*Console, error) {
	cfg.SessionTTL = cmp.Or(cfg.SessionTTL, 8*time.Hour)
	cfg.SampleEvery = cmp.Or(cfg.SampleEvery, 5*time.Second)
	c := &Console{
		cfg:        cfg,
		pool:       cfg.Pool,
		subs:       store.NewSubscriptionStore(cfg.Pool, cfg.AllowHTTP, cfg.SecretGrace).WithKeys(cfg.Keys).WithAllowedCIDRs(cfg.AllowedCIDRs),
		actions:    store.NewDeliveryStore(cfg.Pool),
		deliveries: cfg.Deliveries,
		actor:      audit.TokenID(cfg.Token),
		log:        cfg.Logger,
		sessions:   map[string]*session{},
		mux:        http.NewServeMux(),
	}
	c.subs.Operations = cfg.OperationsTopic
	if c.deliveries == nil {
		c.deliveries = c.actions
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.log = c.log.With("component", "console")
	c.auth = adminapi.NewAuthenticator(cfg.Token, c.log, cfg.Metrics)
	if cfg.JaegerQueryURL != "" {
		c.jaeger = jaegerquery.New(cfg.JaegerQueryURL)
	}
	if len(cfg.Kafka.Brokers) > 0 && cfg.ConsumerGroup != "" {
		opts, err := kafkaclient.Options(cfg.Kafka, nil)
		if err != nil {
			return nil, err
		}
		if c.kafka, err = kgo.NewClient(opts...); err != nil {
			return nil, fmt.Errorf("console: kafka client: %w", err)
		}
	}
	var err error
	if c.pages, err = parsePages(); err != nil {
		return nil, err
	}
	c.routes()
	c.sampler = newSampler(c, cfg.SampleEvery)
	return c, nil
}

// Close stops the sampler and the Kafka client.
func (c *Console) Close() {
	c.sampler.stop()
	if c.kafka != nil {
		c.kafka.Close()
	}
}

func (c *Console) lagAdmin() *kadm.Client {
	if c.kafka == nil {
		return nil
	}
	return kadm.NewClient(c.kafka)
}

const sessionCookie = "bridge_console"

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// secure reports whether the browser reached us over TLS (directly or
// through a proxy that says so): then the cookie is Secure.
func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func (c *Console) newSession(w http.ResponseWriter, r *http.Request) {
	id := randomToken()
	now := time.Now()
	c.mu.Lock()
	for k, s := range c.sessions {
		if now.After(s.expires) {
			delete(c.sessions, k)
		}
	}
	c.sessions[id] = &session{csrf: randomToken(), expires: now.Add(c.cfg.SessionTTL)}
	c.mu.Unlock()
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: id, Path: "/ui/",
		MaxAge: int(c.cfg.SessionTTL.Seconds()), Expires: now.Add(c.cfg.SessionTTL),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure(r),
	})
}

// sessionOf returns the request's live session, or nil.
func (c *Console) sessionOf(r *http.Request) (string, *session) {
	ck, err := r.Cookie(sessionCookie)
	if err != nil || ck.Value == "" {
		return "", nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.sessions[ck.Value]
	if !ok {
		return "", nil
	}
	if time.Now().After(s.expires) {
		delete(c.sessions, ck.Value)
		return "", nil
	}
	return ck.Value, s
}

func (c *Console) endSession(w http.ResponseWriter, r *http.Request, id string) {
	c.mu.Lock()
	delete(c.sessions, id)
	c.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/ui/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure(r)})
}

func (c *Console) setFlash(s *session, msg string) {
	c.mu.Lock()
	s.flash = msg
	c.mu.Unlock()
}

// handOff keeps sub (with its secret) in the session for the page that
// shows it.
func (c *Console) handOff(s *session, sub *store.Subscription, created bool) {
	c.mu.Lock()
	s.handoff = &secretHandoff{sub: sub, created: created, expires: time.Now().Add(handoffTTL)}
	c.mu.Unlock()
}

// takeHandoff returns the session's secret for subscription id once, or
// nil (none, another subscription's, or older than handoffTTL).
func (c *Console) takeHandoff(s *session, id string) *secretHandoff {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := s.handoff
	s.handoff = nil
	if h == nil || h.sub.ID != id || time.Now().After(h.expires) {
		return nil
	}
	return h
}

func (c *Console) takeFlash(s *session) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := s.flash
	s.flash = ""
	return f
}

type ctxKey struct{}

func sessionFrom(ctx context.Context) *session {
	s, _ := ctx.Value(ctxKey{}).(*session)
	return s
}

// securityHeaders: nothing on these pages may come from elsewhere or run
// inline, so an escaping slip in a template still cannot run a script; the
// pages are never framed (clickjacking a "replay all" button) nor cached.
func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}

// ServeHTTP serves /ui/. Static assets and the sign-in page are public;
// everything else needs a session, and every POST its CSRF token.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w.Header())
	if strings.HasPrefix(r.URL.Path, "/ui/static/") {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		c.mux.ServeHTTP(w, r)
		return
	}
	if r.URL.Path == "/ui/login" {
		c.mux.ServeHTTP(w, r)
		return
	}
	_, s := c.sessionOf(r)
	if s == nil {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			if r.Header.Get("HX-Request") == "true" {
				// A polling fragment after the session ended: send the
				// whole page to the sign-in form.
				w.Header().Set("HX-Redirect", "/ui/login")
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
			return
		}
		c.errorPage(w, r, http.StatusUnauthorized, "Your session has ended. Sign in again.")
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if err := r.ParseForm(); err != nil {
			c.errorPage(w, r, http.StatusBadRequest, "Malformed form: "+err.Error())
			return
		}
		got := r.PostFormValue("csrf")
		if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) != 1 {
			c.log.WarnContext(r.Context(), "console request refused: missing or wrong CSRF token", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
			c.errorPage(w, r, http.StatusForbidden, "This form carried no valid CSRF token, so nothing was changed. Reload the page and try again.")
			return
		}
	}
	c.sampler.viewed()
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, s))
	rec := &opsserver.StatusRecorder{ResponseWriter: w}
	c.mux.ServeHTTP(rec, r)
	if r.Method == http.MethodPost {
		c.log.InfoContext(r.Context(), "console request", "method", r.Method, "path", r.URL.Path, "status", rec.Status)
	}
}

func (c *Console) routes() {
	static, _ := fs.Sub(staticFS, "static")
	c.mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", http.FileServerFS(static)))
	c.mux.HandleFunc("GET /ui/login", c.loginPage)
	c.mux.HandleFunc("POST /ui/login", c.login)
	c.mux.HandleFunc("POST /ui/logout", c.logout)
	c.mux.HandleFunc("GET /ui/{$}", c.page(c.overview))
	c.mux.HandleFunc("GET /ui/overview/live", c.page(c.overviewLive))
	c.mux.HandleFunc("GET /ui/outbox", c.page(c.outboxList))
	c.mux.HandleFunc("GET /ui/outbox/replay", c.page(c.outboxReplayConfirm))
	c.mux.HandleFunc("POST /ui/outbox/replay", c.page(c.outboxReplay))
	c.mux.HandleFunc("GET /ui/search", c.page(c.search))
	c.mux.HandleFunc("GET /ui/audit", c.page(c.auditPage))
	c.mux.HandleFunc("GET /ui/outbox/{id}", c.page(c.outboxRow))
	c.mux.HandleFunc("GET /ui/outbox/{id}/status", c.page(c.outboxRowStatus))
	c.mux.HandleFunc("GET /ui/subscriptions", c.page(c.subscriptionList))
	c.mux.HandleFunc("POST /ui/subscriptions", c.page(c.subscriptionCreate))
	c.mux.HandleFunc("GET /ui/subscriptions/{id}", c.page(c.subscriptionPage))
	c.mux.HandleFunc("GET /ui/subscriptions/{id}/secret", c.page(c.subscriptionSecret))
	c.mux.HandleFunc("POST /ui/subscriptions/{id}/edit", c.page(c.subscriptionEdit))
	c.mux.HandleFunc("POST /ui/subscriptions/{id}/rotate", c.page(c.subscriptionRotate))
	c.mux.HandleFunc("POST /ui/subscriptions/{id}/enable", c.page(c.subscriptionEnable))
	c.mux.HandleFunc("POST /ui/subscriptions/{id}/disable", c.page(c.subscriptionDisable))
	c.mux.HandleFunc("POST /ui/subscriptions/{id}/delete", c.page(c.subscriptionDelete))
	c.mux.HandleFunc("POST /ui/subscriptions/{id}/test", c.page(c.subscriptionTest))
	c.mux.HandleFunc("GET /ui/deliveries", c.page(c.deliveryList))
	c.mux.HandleFunc("GET /ui/deliveries/revive", c.page(c.reviveConfirm))
	c.mux.HandleFunc("POST /ui/deliveries/revive", c.page(c.revive))
	c.mux.HandleFunc("GET /ui/deliveries/recover", c.page(c.recoverConfirm))
	c.mux.HandleFunc("POST /ui/deliveries/recover", c.page(c.recover))
	c.mux.HandleFunc("GET /ui/deliveries/{id}", c.page(c.deliveryPage))
	c.mux.HandleFunc("GET /ui/streams", c.page(c.streamPage))
	c.mux.HandleFunc("GET /ui/trace/{id}", c.page(c.tracePage))
	c.mux.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		c.errorPage(w, r, http.StatusNotFound, "There is no console page at "+r.URL.Path+".")
	})
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if _, s := c.sessionOf(r); s != nil {
		http.Redirect(w, r, "/ui/", http.StatusSeeOther)
		return
	}
	c.render(w, r, http.StatusOK, "login", "Sign in", map[string]any{})
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		c.render(w, r, http.StatusBadRequest, "login", "Sign in", map[string]any{"Error": "Malformed form."})
		return
	}
	if !c.auth.Valid(r.PostFormValue("token")) {
		c.auth.Reject(r, "wrong token in the console sign-in form")
		c.render(w, r, http.StatusUnauthorized, "login", "Sign in", map[string]any{"Error": "That is not the admin token (ADMIN_TOKEN) of this bridge."})
		return
	}
	if id, _ := c.sessionOf(r); id != "" {
		c.endSession(w, r, id) // a fresh session id on every sign-in (no fixation)
	}
	c.newSession(w, r)
	c.log.InfoContext(r.Context(), "console sign-in", "remote", r.RemoteAddr)
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	id, _ := c.sessionOf(r)
	c.endSession(w, r, id)
	c.log.InfoContext(r.Context(), "console sign-out", "remote", r.RemoteAddr)
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// errorPage answers with a page saying what went wrong (escaped: messages
// may quote input).
func (c *Console) errorPage(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "error", "Error", map[string]any{"Message": msg, "Status": status})
}

// page adapts a page handler that returns its failure instead of answering
// it: fail answers it, so no handler can write an error page and then go on
// (the admin API's handlers work the same way).
func (c *Console) page(h func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			c.fail(w, r, err)
		}
	}
}

// statusError is a failure a handler already knows how to answer: this
// status, with this message for the operator.
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return e.msg }

func errorStatus(status int, msg string) error { return &statusError{status: status, msg: msg} }

// fail answers a handler's error: one it gave a status to, a validation
// error or an unknown id is the operator's (4xx, shown), anything else is
// logged and shown as internal.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	var ve *store.ValidationError
	var se *statusError
	switch {
	case errors.As(err, &se):
		c.errorPage(w, r, se.status, se.msg)
	case errors.As(err, &ve):
		c.errorPage(w, r, http.StatusBadRequest, ve.Error())
	case errors.Is(err, store.ErrNotFound):
		c.errorPage(w, r, http.StatusNotFound, err.Error())
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
	default:
		c.log.ErrorContext(r.Context(), "console request failed", "method", r.Method, "path", r.URL.Path, "error", err)
		c.errorPage(w, r, http.StatusInternalServerError, "Internal error (logged by the bridge).")
	}
}
