package adminapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/api"
	"github.com/outboxbridge/bridge/internal/audit"
	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery/kafkawindow"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/keyring"
	"github.com/outboxbridge/bridge/internal/opsserver"
	"github.com/outboxbridge/bridge/outbox/schema"
)

// Config configures the API.
type Config struct {
	// Token is ADMIN_TOKEN. Empty: Mount mounts nothing.
	Token string
	// Pool is the bridge database.
	Pool *pgxpool.Pool
	// AllowHTTP accepts http:// subscription URLs (WEBHOOK_ALLOW_HTTP).
	AllowHTTP bool
	// AllowedCIDRs: a subscription URL whose host is a literal address the
	// deliverer refuses is refused, except in these (WEBHOOK_ALLOWED_CIDRS).
	AllowedCIDRs []netip.Prefix
	// SecretGrace is how long a rotated-out secret keeps signing
	// (WEBHOOK_SECRET_GRACE).
	SecretGrace time.Duration
	// OperationsTopic: disables, enables and rotations are announced there
	// (BRIDGE_OPERATIONS_TOPIC); "": not announced.
	OperationsTopic string
	// Keys seals the secrets the API creates and rotates
	// (BRIDGE_SECRET_KEYS); nil: plain text (BRIDGE_ALLOW_PLAINTEXT_SECRETS).
	Keys *keyring.Ring
	// Logger records every write the API makes (method, path, status; never
	// bodies), rejected requests (rate-limited per source) and server-side
	// failures. Default discards.
	Logger *slog.Logger
	// Metrics counts rejected requests. nil: not counted.
	Metrics AuthMetrics
	// Schemas is the schema registry (SCHEMA_REGISTRY_URL); nil: the
	// schema endpoints answer 404 naming the variable.
	Schemas *schema.Registry
	// KafkaWindow is where recover reads a window from Kafka when the fast
	// lane is on (WEBHOOK_FAST_LANE); nil: recover reads bridge.deliveries
	// only. KafkaWindowErr is why it could not be built (recover then
	// answers 500 naming it rather than silently reading the rows only).
	KafkaWindow    *kafkawindow.Source
	KafkaWindowErr error
}

// FromConfig is the API's Config from the bridge configuration.
func FromConfig(cfg *config.Config, pool *pgxpool.Pool, logger *slog.Logger) Config {
	c := Config{
		Token:       cfg.HTTP.AdminToken,
		Pool:        pool,
		AllowHTTP:   cfg.Webhook.AllowHTTP,
		SecretGrace: cfg.Webhook.SecretGrace,
		// config.Load has parsed WEBHOOK_ALLOWED_CIDRS already: no error here.
		AllowedCIDRs: func() []netip.Prefix { p, _ := cfg.Webhook.ParsedAllowedCIDRs(); return p }(),
		Keys:         cfg.Secrets.Ring(),
		Logger:       logger,

		OperationsTopic: cfg.Operations.Topic,
		Schemas:         schemaRegistry(cfg, logger),
	}
	var values contract.ValueDecoder
	if c.Schemas != nil {
		values = c.Schemas
	}
	c.KafkaWindow, c.KafkaWindowErr = kafkawindow.SourceFromConfig(cfg, values, logger)
	return c
}

// schemaRegistry is the registry at SCHEMA_REGISTRY_URL, nil when unset.
func schemaRegistry(cfg *config.Config, logger *slog.Logger) *schema.Registry {
	if cfg.Schemas.URL == "" {
		return nil
	}
	reg, err := schema.New(schema.Config{URL: cfg.Schemas.URL, RefreshInterval: cfg.Schemas.Refresh})
	if err != nil && logger != nil {
		logger.Warn("admin API: no schema endpoints", "error", err)
	}
	return reg
}

// MinTokenLength is the ADMIN_TOKEN length below which Mount warns: a
// short token is guessable, and the API has no lockout.
const MinTokenLength = 16

// Mounter is what the API mounts on: *opsserver.Server, *http.ServeMux.
type Mounter interface {
	Handle(pattern string, h http.Handler)
}

// Mount mounts /api/v1/ and GET /openapi.json on m when cfg.Token is set,
// and reports whether it did. m may be nil (HTTP_ADDR empty): nothing to
// mount on.
func Mount(m Mounter, cfg Config) bool {
	if m == nil || cfg.Token == "" {
		return false
	}
	a := newAPI(cfg)
	if strings.TrimSpace(cfg.Token) == "" {
		// A blank token would let "Authorization: Bearer " in.
		a.log.Warn("admin API not mounted: ADMIN_TOKEN is blank")
		return false
	}
	if len(strings.TrimSpace(cfg.Token)) < MinTokenLength {
		a.log.Warn(fmt.Sprintf("ADMIN_TOKEN is shorter than %d characters; use a long random token (e.g. openssl rand -hex 32)", MinTokenLength))
	}
	m.Handle("/api/v1/", a)
	m.Handle("GET /openapi.json", http.HandlerFunc(serveOpenAPI))
	a.log.Info("admin API mounted", "paths", "/api/v1/, /openapi.json")
	return true
}

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set(contract.HeaderContentType, contract.ContentTypeJSON)
	_, _ = w.Write(api.OpenAPI)
}

type adminAPI struct {
	// tokenDigest is sha256(ADMIN_TOKEN); the token itself is not kept.
	tokenDigest [sha256.Size]byte
	pool        *pgxpool.Pool
	subs        *store.SubscriptionStore
	deliveries  *store.DeliveryStore
	log         *slog.Logger
	rejections  *rejectionLog
	metrics     AuthMetrics
	routes      *http.ServeMux
	schemas     *schema.Registry
	kafkaWindow *kafkawindow.Source
	kafkaErr    error
}

func newAPI(cfg Config) *adminAPI {
	a := &adminAPI{
		tokenDigest: sha256.Sum256([]byte(strings.TrimSpace(cfg.Token))),
		pool:        cfg.Pool,
		subs:        store.NewSubscriptionStore(cfg.Pool, cfg.AllowHTTP, cfg.SecretGrace).WithKeys(cfg.Keys).WithAllowedCIDRs(cfg.AllowedCIDRs),
		deliveries:  store.NewDeliveryStore(cfg.Pool),
		log:         cfg.Logger,
		metrics:     cfg.Metrics,
		routes:      http.NewServeMux(),
		schemas:     cfg.Schemas,
		kafkaWindow: cfg.KafkaWindow,
		kafkaErr:    cfg.KafkaWindowErr,
	}
	a.subs.Operations = cfg.OperationsTopic
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	a.log = a.log.With("component", "adminapi")
	a.rejections = newRejectionLog(a.log)
	for _, rt := range a.routeTable() {
		a.routes.Handle(rt.pattern, a.handle(rt.handler))
	}
	return a
}

type route struct {
	pattern string // http.ServeMux syntax; the OpenAPI document has each
	handler handlerFunc
}

// routeTable is every endpoint (a test checks it against api/openapi.json).
func (a *adminAPI) routeTable() []route {
	return []route{
		{"GET /api/v1/outbox/stats", a.outboxStats},
		{"GET /api/v1/outbox/failed", a.outboxFailed},
		{"POST /api/v1/outbox/replay", a.outboxReplay},
		{"GET /api/v1/subscriptions", a.listSubscriptions},
		{"POST /api/v1/subscriptions", a.createSubscription},
		{"GET /api/v1/subscriptions/{id}", a.getSubscription},
		{"PATCH /api/v1/subscriptions/{id}", a.updateSubscription},
		{"DELETE /api/v1/subscriptions/{id}", a.deleteSubscription},
		{"POST /api/v1/subscriptions/{id}/rotate-secret", a.rotateSecret},
		{"POST /api/v1/subscriptions/{id}/enable", a.enableSubscription},
		{"POST /api/v1/subscriptions/{id}/disable", a.disableSubscription},
		{"GET /api/v1/deliveries", a.listDeliveries},
		{"GET /api/v1/deliveries/{id}", a.getDelivery},
		{"GET /api/v1/deliveries/{id}/attempts", a.deliveryAttempts},
		{"GET /api/v1/attempts", a.listAttempts},
		{"POST /api/v1/deliveries/revive", a.reviveDeliveries},
		{"POST /api/v1/deliveries/recover", a.recoverDeliveries},
		{"GET /api/v1/schemas", a.listSchemas},
		{"GET /api/v1/schemas/{topic}", a.schemaHistory},
	}
}

// ServeHTTP authenticates, then routes. Authentication comes first so that
// without the token every path answers 401 alike: the API's shape is not
// probed by unauthenticated clients.
func (a *adminAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if !a.authorized(r) {
		if a.metrics != nil {
			a.metrics.AuthFailure()
		}
		reason := "wrong bearer token"
		if r.Header.Get("Authorization") == "" {
			reason = "no Authorization header"
		}
		a.rejections.reject(r.Context(), r, reason)
		w.Header().Set("WWW-Authenticate", `Bearer realm="outbox-bridge admin API"`)
		writeJSON(w, http.StatusUnauthorized, errorBody{Error: "missing or wrong bearer token (Authorization: Bearer <ADMIN_TOKEN>)", Field: "Authorization"})
		return
	}
	if _, pattern := a.routes.Handler(r); pattern == "" {
		a.unrouted(w, r)
		return
	}
	a.routes.ServeHTTP(w, r)
}

// audit writes one action to the audit log. The action has happened: a
// failure to record it is logged, not answered as the action's failure.
func (a *adminAPI) audit(r *http.Request, action, target, scope string, rows int64) {
	e := audit.Entry{Actor: audit.DigestID(a.tokenDigest), Via: audit.ViaAPI, Remote: audit.Remote(r), Action: action, Target: target, Scope: scope, Rows: rows}
	if err := audit.Record(context.WithoutCancel(r.Context()), a.pool, e); err != nil {
		a.log.ErrorContext(r.Context(), "audit log write failed", "action", action, "error", err)
	}
}

func (a *adminAPI) authorized(r *http.Request) bool { return bearerMatches(r, a.tokenDigest) }

// Authorizes returns whether a request carries token as its bearer token
// (for what else on HTTP_ADDR shows more to the admin, like /readyz's
// error details). A blank token authorizes nobody.
func Authorizes(token string) func(*http.Request) bool {
	token = strings.TrimSpace(token)
	if token == "" {
		return func(*http.Request) bool { return false }
	}
	digest := sha256.Sum256([]byte(token))
	return func(r *http.Request) bool { return bearerMatches(r, digest) }
}

// bearerMatches compares the bearer token with the one whose digest is
// given (tokenMatches). Both sides are hashed: subtle.ConstantTimeCompare
// returns at once on a length mismatch, which would reveal the token's
// length.
func bearerMatches(r *http.Request, digest [sha256.Size]byte) bool {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return tokenMatches(token, digest)
}

// tokenMatches compares token (trimmed; blank never matches) with the one
// whose digest is given, in constant time: the one comparison of the admin
// token, for the API's header and the console's sign-in form alike.
func tokenMatches(token string, digest [sha256.Size]byte) bool {
	token = strings.TrimSpace(token)
	if len(token) == 0 {
		return false
	}
	got := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(got[:], digest[:]) == 1
}

// unrouted answers a request no pattern matches in JSON: 405 (with Allow)
// when the path exists for other methods, else 404. The mux decides which;
// its answer is captured and translated.
func (a *adminAPI) unrouted(w http.ResponseWriter, r *http.Request) {
	h, _ := a.routes.Handler(r)
	c := &captureWriter{header: http.Header{}}
	h.ServeHTTP(c, r)
	switch {
	case c.status == http.StatusMethodNotAllowed:
		w.Header().Set("Allow", c.header.Get("Allow"))
		writeJSON(w, http.StatusMethodNotAllowed, errorBody{Error: "method " + r.Method + " is not allowed here (allowed: " + c.header.Get("Allow") + ")"})
	case c.status >= 300 && c.status < 400:
		// The mux redirects unclean paths (/api/v1//x) to their clean form.
		w.Header().Set("Location", c.header.Get("Location"))
		w.WriteHeader(c.status)
	default:
		writeJSON(w, http.StatusNotFound, errorBody{Error: "no such endpoint: " + r.URL.Path + " (see /openapi.json)"})
	}
}

type captureWriter struct {
	header http.Header
	status int
}

func (c *captureWriter) Header() http.Header { return c.header }
func (c *captureWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	return len(b), nil
}
func (c *captureWriter) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}

// handlerFunc is an endpoint: it writes its success itself and returns the
// error to answer otherwise.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (a *adminAPI) handle(f handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &opsserver.StatusRecorder{ResponseWriter: w}
		err := f(rec, r)
		if err != nil {
			a.writeError(rec, r, err)
		}
		if r.Method != http.MethodGet && rec.Status < 500 {
			a.log.InfoContext(r.Context(), "admin API request", "method", r.Method, "path", r.URL.Path, "status", rec.Status)
		}
	})
}

// apiError is an answer other than success.
type apiError struct {
	Status  int
	Field   string
	Message string
}

func (e *apiError) Error() string { return e.Message }

func badRequest(field, message string) error {
	return &apiError{Status: http.StatusBadRequest, Field: field, Message: message}
}

// errorBody is every error's JSON.
type errorBody struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

// storeFields maps the stores' field names (the CLI's flag names) to the
// API's JSON names.
var storeFields = map[string]string{
	"event-types":     "event_types",
	"rate-limit":      "rate_limit",
	"rate-burst":      "rate_burst",
	"subscription id": "id",
}

func (a *adminAPI) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	var ve *store.ValidationError
	switch {
	case errors.As(err, &ae):
		writeJSON(w, ae.Status, errorBody{Error: ae.Message, Field: ae.Field})
	case errors.As(err, &ve):
		field := ve.Field
		if f, ok := storeFields[field]; ok {
			field = f
		}
		msg := ve.Problem
		if ve.Value != "" {
			msg = strings.TrimSpace(ve.Value) + ": " + ve.Problem
		}
		writeJSON(w, http.StatusBadRequest, errorBody{Error: msg, Field: field})
	case errors.Is(err, store.ErrNotFound):
		writeJSON(w, http.StatusNotFound, errorBody{Error: err.Error(), Field: "id"})
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client went away; nobody reads an answer.
		a.log.DebugContext(r.Context(), "admin API request cancelled", "method", r.Method, "path", r.URL.Path)
	default:
		a.log.ErrorContext(r.Context(), "admin API request failed", "method", r.Method, "path", r.URL.Path, "error", err)
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: "internal error (logged by the bridge)"})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":"internal error (response encoding)"}`)
	}
	w.Header().Set(contract.HeaderContentType, contract.ContentTypeJSON)
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// List is every list's answer, in the API and in the CLI's -o json (one
// shape and one cursor name everywhere: a script written against one works
// against the other).
type List[T any] struct {
	Items []T `json:"items"`
	// NextCursor fetches the next page; absent on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}
