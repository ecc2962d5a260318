package opsserver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/database"
)

// Check is one Readiness condition.
type Check struct {
	// Name appears in the /readyz body ("postgres", "schema", "kafka").
	Name string
	// Run returns nil when the condition holds. Its context carries the
	// check timeout.
	Run func(ctx context.Context) error
}

// PostgresCheck: the pool can reach PostgreSQL.
func PostgresCheck(pool *pgxpool.Pool) Check {
	return Check{Name: "postgres", Run: pool.Ping}
}

// SchemaCheck: the schema is exactly the version this binary needs
// (database.CheckCurrent). A replica of a newer release started before
// `bridge migrate` ran stays unready instead of failing its queries.
func SchemaCheck(pool *pgxpool.Pool) Check {
	return Check{Name: "schema", Run: func(ctx context.Context) error { return database.CheckCurrent(ctx, pool) }}
}

// KafkaCheck: a broker answers ping (e.g. (*kgo.Client).Ping).
func KafkaCheck(ping func(context.Context) error) Check {
	return Check{Name: "kafka", Run: ping}
}

// Config configures a Server. Zero values take the defaults given.
type Config struct {
	// Addr to listen on, host:port (port 0: any free port). Required for
	// Start.
	Addr string
	// Metrics serves GET /metrics. nil: no /metrics route.
	Metrics http.Handler
	// Checks decide /readyz; all must pass. None: ready whenever alive.
	Checks []Check
	// CheckTimeout bounds each check. Default 2s (below the 1s-period,
	// 3s-timeout probes orchestrators commonly use, with room).
	CheckTimeout time.Duration
	// CacheFor: a Readiness result is reused for this long, so a flood of
	// probes costs one round of checks. Default 1s; negative disables.
	CacheFor time.Duration
	// Logger reports serve errors and Readiness changes. Default discards.
	Logger *slog.Logger
	// ShowDetails says whether a /readyz request may see the failing
	// checks' error text (the admin token: adminapi.Authorizes). A check's
	// error names the database user, database, hosts and ports, which
	// anyone who can reach the port would otherwise read. nil: nobody;
	// the body names the failing check and the log has the error.
	ShowDetails func(*http.Request) bool
}

// Server is the ops HTTP server.
type Server struct {
	cfg Config
	mux *http.ServeMux
	log *slog.Logger

	mu       sync.Mutex // guards the listener state
	srv      *http.Server
	addr     string
	done     chan struct{}
	shutdown bool

	// readyMu is held across a round of checks: probes arriving meanwhile
	// wait for its result instead of starting their own.
	readyMu sync.Mutex
	last    Readiness
	lastAt  time.Time
	lastOK  *bool
}

// New returns a server with /healthz, /readyz and (if cfg.Metrics is set)
// /metrics routed; it does not listen until Start.
func New(cfg Config) *Server {
	cfg.CheckTimeout = cmp.Or(cfg.CheckTimeout, 2*time.Second)
	cfg.CacheFor = cmp.Or(cfg.CacheFor, time.Second)
	s := &Server{cfg: cfg, mux: http.NewServeMux(), log: cfg.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set(contract.HeaderContentType, "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte("ok\n"))
	})
	s.mux.HandleFunc("GET /readyz", s.serveReady)
	if cfg.Metrics != nil {
		s.mux.Handle("GET /metrics", cfg.Metrics)
	}
	return s
}

// Handle mounts h on pattern (http.ServeMux syntax, e.g. "GET /v1/…"). It
// may be called before or after Start.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler is the server's mux (tests, or embedding in another server).
func (s *Server) Handler() http.Handler { return s.mux }

// Start listens on cfg.Addr and serves in the background. A busy or invalid
// address is reported here, so the command fails at start rather than
// running without its health endpoints.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return errors.New("ops server already started")
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR=%s: %w", s.cfg.Addr, err)
	}
	s.addr = ln.Addr().String()
	s.srv = &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("ops HTTP server stopped", "addr", s.addr, "error", err)
		}
	}()
	s.log.Info("ops HTTP server listening", "addr", s.addr)
	return nil
}

// Addr is the address the server listens on (with the port chosen when
// cfg.Addr asked for port 0); "" before Start.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Shutdown stops accepting connections and waits (until ctx ends) for
// requests in flight. Safe to call twice, and before Start.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	srv, done := s.srv, s.done
	already := s.shutdown
	s.shutdown = true
	s.mu.Unlock()
	if srv == nil || already {
		return nil
	}
	err := srv.Shutdown(ctx)
	if err != nil {
		srv.Close()
	}
	<-done
	if err != nil {
		return fmt.Errorf("shut down ops HTTP server: %w", err)
	}
	return nil
}

// CheckResult is one check's outcome in the /readyz body.
type CheckResult struct {
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// Readiness is the /readyz body.
type Readiness struct {
	Status string        `json:"status"` // "ready" | "not ready"
	Checks []CheckResult `json:"checks"`
}

// withoutDetails is r with the checks' error text removed (a copy: r may
// be the cached result).
func (r Readiness) withoutDetails() Readiness {
	checks := make([]CheckResult, len(r.Checks))
	for i, c := range r.Checks {
		checks[i] = CheckResult{Name: c.Name, OK: c.OK}
	}
	r.Checks = checks
	return r
}

// OK reports whether every check passed.
func (r Readiness) OK() bool { return r.Status == "ready" }

// AddCheck adds a check to /readyz: one only a stage built after the
// server can provide (a stage's progress, internal/progress).
func (s *Server) AddCheck(c Check) {
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	s.cfg.Checks = append(s.cfg.Checks, c)
	s.lastAt = time.Time{}
}

// Ready runs the checks (concurrently, each with the check timeout) and
// returns the result, reusing one younger than cfg.CacheFor.
func (s *Server) Ready(ctx context.Context) Readiness {
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	if s.lastOK != nil && s.cfg.CacheFor > 0 && time.Since(s.lastAt) < s.cfg.CacheFor {
		return s.last
	}
	res := Readiness{Status: "ready", Checks: make([]CheckResult, len(s.cfg.Checks))}
	var wg sync.WaitGroup
	for i, c := range s.cfg.Checks {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, s.cfg.CheckTimeout)
			defer cancel()
			err := c.Run(cctx)
			res.Checks[i] = CheckResult{Name: c.Name, OK: err == nil}
			if err != nil {
				res.Checks[i].Error = err.Error()
			}
		})
	}
	wg.Wait()
	for _, c := range res.Checks {
		if !c.OK {
			res.Status = "not ready"
		}
	}
	ok := res.OK()
	if s.lastOK == nil || *s.lastOK != ok {
		if ok {
			s.log.InfoContext(ctx, "ready")
		} else {
			s.log.WarnContext(ctx, "not ready", "checks", res.Checks)
		}
	}
	s.last, s.lastAt, s.lastOK = res, time.Now(), &ok
	return res
}

func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	res := s.Ready(r.Context())
	if s.cfg.ShowDetails == nil || !s.cfg.ShowDetails(r) {
		res = res.withoutDetails()
	}
	w.Header().Set(contract.HeaderContentType, contract.ContentTypeJSON)
	w.Header().Set("Cache-Control", "no-store")
	if !res.OK() {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(res)
}
