// Command receiver is the sample webhook receiver of docker-compose.yml: it
// subscribes itself through the bridge's admin API, then verifies every
// request's Standard Webhooks signature with the secret it was given, checks
// that each asset's events arrive in asset_seq order, and logs one line per
// request.
//
// Configuration (its own, not the bridge's):
//
//	RECEIVER_ADDR         listen address (default :9000)
//	RECEIVER_URL          the URL the bridge should call, e.g. http://receiver:9000/webhook (required)
//	RECEIVER_EVENT_TYPES  comma-separated event types to subscribe to (default *)
//	RECEIVER_TOPIC        only events of this topic (default: every topic)
//	ADMIN_API             the bridge's admin API base URL, e.g. http://deliver:8080 (required)
//	ADMIN_TOKEN           its bearer token (required)
//
// GET /healthz is 200 once subscribed; GET /stats reports the counts.
// `receiver -healthcheck` probes /healthz and exits 0 or 1, for a container
// image without curl.
//
// On restart it finds its subscription by URL and rotates the secret rather
// than creating a second subscription: the secret is shown only on create
// and rotate, and the previous one keeps signing during
// WEBHOOK_SECRET_GRACE, so nothing in flight fails verification.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

func main() {
	healthcheck := flag.Bool("healthcheck", false, "probe this receiver's /healthz and exit 0 when it is subscribed")
	flag.Parse()
	addr := envOr("RECEIVER_ADDR", ":9000")
	if *healthcheck {
		os.Exit(probe(addr))
	}
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	cfg := config{
		URL:        os.Getenv("RECEIVER_URL"),
		EventTypes: strings.Split(envOr("RECEIVER_EVENT_TYPES", "*"), ","),
		Topic:      os.Getenv("RECEIVER_TOPIC"),
		AdminAPI:   strings.TrimRight(os.Getenv("ADMIN_API"), "/"),
		AdminToken: os.Getenv("ADMIN_TOKEN"),
	}
	for name, v := range map[string]string{"RECEIVER_URL": cfg.URL, "ADMIN_API": cfg.AdminAPI, "ADMIN_TOKEN": cfg.AdminToken} {
		if v == "" {
			fmt.Fprintf(os.Stderr, "receiver: %s is required\n", name)
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	r := newReceiver(log)
	srv := &http.Server{Addr: addr, Handler: r.routes(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("listen", "addr", addr, "error", err)
			stop()
		}
	}()
	go func() {
		// The bridge may still be starting: retry until it answers.
		for {
			id, secret, err := subscribe(ctx, http.DefaultClient, cfg)
			if err == nil {
				if err := r.setSecret(secret); err != nil {
					log.Error("secret from the admin API", "error", err)
					stop()
					return
				}
				log.Info("subscribed", "subscription_id", id, "url", cfg.URL, "event_types", cfg.EventTypes)
				return
			}
			log.Warn("subscribe through the admin API (retrying)", "admin_api", cfg.AdminAPI, "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(2 * time.Second):
			}
		}
	}()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	log.Info("stopped", "stats", r.snapshot())
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func probe(addr string) int {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 1
	}
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://127.0.0.1:" + port + "/healthz")
	if err != nil {
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 1
	}
	return 0
}

type config struct {
	URL        string
	EventTypes []string
	Topic      string
	AdminAPI   string
	AdminToken string
}

// subscribe finds the subscription for cfg.URL (rotating its secret) or
// creates one, and returns its id and signing secret.
func subscribe(ctx context.Context, c *http.Client, cfg config) (id, secret string, err error) {
	cursor := ""
	for {
		q := url.Values{"limit": {"1000"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page struct {
			Items []struct {
				ID  string `json:"id"`
				URL string `json:"url"`
			} `json:"items"`
			NextCursor string `json:"next_cursor"`
		}
		if err := call(ctx, c, cfg, "GET", "/api/v1/subscriptions?"+q.Encode(), nil, http.StatusOK, &page); err != nil {
			return "", "", err
		}
		for _, s := range page.Items {
			if s.URL == cfg.URL {
				var sub struct {
					Secret string `json:"secret"`
				}
				err := call(ctx, c, cfg, "POST", "/api/v1/subscriptions/"+s.ID+"/rotate-secret", nil, http.StatusOK, &sub)
				return s.ID, sub.Secret, err
			}
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	body := map[string]any{"url": cfg.URL, "event_types": cfg.EventTypes, "description": "docker compose sample receiver"}
	if cfg.Topic != "" {
		body["topic"] = cfg.Topic
	}
	var sub struct {
		ID     string `json:"id"`
		Secret string `json:"secret"`
	}
	err = call(ctx, c, cfg, "POST", "/api/v1/subscriptions", body, http.StatusCreated, &sub)
	return sub.ID, sub.Secret, err
}

func call(ctx context.Context, c *http.Client, cfg config, method, path string, body any, want int, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, cfg.AdminAPI+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+cfg.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	return json.Unmarshal(b, out)
}

// receiver verifies and counts webhook requests.
type receiver struct {
	log *slog.Logger

	mu       sync.Mutex
	verifier *standardwebhooks.Webhook // nil until subscribed
	lastSeq  map[string]int64          // asset ("" = null asset) → last asset_seq seen
	stats    stats
}

type stats struct {
	Received          int `json:"received"`
	Verified          int `json:"verified"`
	SignatureFailures int `json:"signature_failures"`
	// OutOfOrder counts events older than one already received for their
	// asset. Zero in normal operation; a FAILED row replayed after later
	// events of its asset were sent shows up here by design (its asset_seq
	// tells the receiver so).
	OutOfOrder   int `json:"out_of_order"`
	Redeliveries int `json:"redeliveries"`
}

func newReceiver(log *slog.Logger) *receiver {
	return &receiver{log: log, lastSeq: map[string]int64{}}
}

func (r *receiver) setSecret(secret string) error {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.verifier = wh
	r.mu.Unlock()
	return nil
}

func (r *receiver) snapshot() stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

func (r *receiver) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /webhook", r.webhook)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		r.mu.Lock()
		ready := r.verifier != nil
		r.mu.Unlock()
		if !ready {
			http.Error(w, "not subscribed yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(r.snapshot())
	})
	return mux
}

// envelope is the webhook body (PRODUCT.md, "Webhook request").
type envelope struct {
	ID       string          `json:"id"`
	Type     string          `json:"type"`
	AssetID  *string         `json:"asset_id"`
	AssetSeq *int64          `json:"asset_seq"`
	Data     json.RawMessage `json:"data"`
}

func (r *receiver) webhook(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 4<<20))
	if err != nil {
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats.Received++
	if r.verifier == nil {
		// Not subscribed yet: refuse, the bridge retries.
		http.Error(w, "not subscribed yet", http.StatusServiceUnavailable)
		return
	}
	if err := r.verifier.Verify(body, req.Header); err != nil {
		r.stats.SignatureFailures++
		r.log.Warn("signature verification failed", "webhook_id", req.Header.Get("webhook-id"), "error", err)
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	r.stats.Verified++
	var ev envelope
	if err := json.Unmarshal(body, &ev); err != nil {
		r.log.Warn("body is not the bridge's envelope", "error", err)
		http.Error(w, "bad envelope", http.StatusBadRequest)
		return
	}
	asset := ""
	if ev.AssetID != nil {
		asset = *ev.AssetID
	}
	order := "ok"
	last, seen := r.lastSeq[asset]
	switch {
	case ev.AssetSeq == nil:
		order = "unsequenced" // a record the relay did not produce
	case seen && *ev.AssetSeq == last:
		// At least once: the same event again (same webhook-id) is
		// harmless; a real receiver dedups on webhook-id.
		order = "redelivery"
		r.stats.Redeliveries++
	case seen && *ev.AssetSeq < last:
		order = "out_of_order"
		r.stats.OutOfOrder++
	default:
		r.lastSeq[asset] = *ev.AssetSeq
	}
	r.log.Info("webhook",
		"webhook_id", req.Header.Get("webhook-id"), "type", ev.Type, "asset_id", ev.AssetID, "asset_seq", ev.AssetSeq,
		"order", order, "traceparent", req.Header.Get("traceparent"), "bytes", len(body))
	w.WriteHeader(http.StatusNoContent)
}
