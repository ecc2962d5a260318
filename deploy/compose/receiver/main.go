// Command receiver is the sample webhook receiver of docker-compose.yml: it
// subscribes itself through the bridge's admin API, then checks every request
// with internal/webhooktest (the Standard Webhooks signature with the secret it
// was given, duplicates by webhook-id, each asset's events in asset_seq order,
// one request of an asset at a time) and logs one line per request before it
// answers.
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

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/webhooktest"
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
	req.Header.Set(contract.HeaderContentType, contract.ContentTypeJSON)
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

// receiver is the sample's webhook endpoint: internal/webhooktest's Receiver
// (signature, dedup by webhook-id, per-asset order, overlapping requests)
// with one log line per request, written before the answer is sent, so a
// receiver killed right after answering cannot have lost a logged 2xx.
type receiver struct {
	log *slog.Logger
	rcv *webhooktest.Receiver

	mu    sync.Mutex
	stats stats
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
	// Overlapping counts requests of one asset that arrived while another was
	// still in flight. Zero: the bridge sends one at a time per asset.
	Overlapping int `json:"overlapping"`
}

func newReceiver(log *slog.Logger) *receiver {
	r := &receiver{log: log, rcv: webhooktest.New()}
	// One subscription: every path is the same stream namespace.
	r.rcv.StreamOf = func(*http.Request) string { return "" }
	r.rcv.Observe = r.observe
	return r
}

func (r *receiver) setSecret(secret string) error { return r.rcv.SetSecret("", secret) }

func (r *receiver) snapshot() stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

func (r *receiver) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /webhook", r.rcv)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !r.rcv.Ready() {
			http.Error(w, "not subscribed yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set(contract.HeaderContentType, contract.ContentTypeJSON)
		_ = json.NewEncoder(w).Encode(r.snapshot())
	})
	return mux
}

// observe counts and logs one request; the receiver calls it before it
// answers.
func (r *receiver) observe(q *webhooktest.Request) {
	r.mu.Lock()
	r.stats.Received++
	switch q.Outcome {
	case webhooktest.BadSignature:
		r.stats.SignatureFailures++
	case webhooktest.Accepted, webhooktest.Duplicate, webhooktest.Refused:
		r.stats.Verified++
	case webhooktest.Malformed:
		if q.Status == http.StatusBadRequest { // signed, but not the envelope
			r.stats.Verified++
		}
	}
	if q.Overlap {
		r.stats.Overlapping++
	}
	order := "ok"
	switch {
	case q.Outcome == webhooktest.Duplicate:
		// At least once: the same event again (same webhook-id) is
		// harmless; it is acknowledged and ignored.
		order = "redelivery"
		r.stats.Redeliveries++
	case q.OrderViolation != "":
		order = "out_of_order"
		r.stats.OutOfOrder++
	case q.Outcome == webhooktest.Accepted && q.Envelope.AssetSeq == nil:
		order = "unsequenced" // a record the relay did not produce
	}
	r.mu.Unlock()

	switch q.Outcome {
	case webhooktest.BadSignature:
		r.log.Warn("signature verification failed", "webhook_id", q.WebhookID, "status", q.Status)
	case webhooktest.Malformed:
		r.log.Warn("body is not the bridge's envelope", "webhook_id", q.WebhookID, "status", q.Status, "bytes", len(q.Body))
	case webhooktest.NotReady:
		r.log.Warn("webhook before subscribing (refused, the bridge retries)", "webhook_id", q.WebhookID, "status", q.Status)
	default:
		ev := q.Envelope
		r.log.Info("webhook",
			"webhook_id", q.WebhookID, "type", ev.Type, "asset_id", ev.AssetID, "asset_seq", ev.AssetSeq,
			"order", order, "overlap", q.Overlap, "status", q.Status, contract.HeaderTraceparent, q.Traceparent, "bytes", len(q.Body))
	}
}
