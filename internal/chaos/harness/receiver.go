package harness

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/outboxbridge/bridge/internal/chaos/judge"
	"github.com/outboxbridge/bridge/internal/contract"
)

// Receiver is the webhook endpoint of a fault run. It serves
// /hook/<subscription>, verifies each request's Standard Webhooks signature,
// answers 500 to the first FailFirst[sub] attempts of each event of a
// failing subscription, and appends one JSON line per request to its log —
// written before the answer, so a receiver that goes down cannot lose a 2xx
// it gave. The judge reads that log, not the receiver's memory.
type Receiver struct {
	Port      int
	FailFirst map[string]int // subscription → failed attempts per event

	mu       sync.Mutex
	log      *os.File
	path     string
	secrets  map[string]*standardwebhooks.Webhook
	attempts map[string]int // sub/webhook-id → attempts seen
	srv      *http.Server
	ln       net.Listener
	count    int
	ok       int
	acked    map[string]bool // sub/webhook-id answered 2xx
}

// Line is one logged request.
type Line struct {
	Sub       string    `json:"sub"`
	WebhookID string    `json:"webhook_id"`
	Timestamp string    `json:"webhook_timestamp"`
	Signature string    `json:"webhook_signature"`
	Body      string    `json:"body"`
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
	Status    int       `json:"status"`
}

// NewReceiver listens on a free loopback port, logging to path.
func NewReceiver(path string) (*Receiver, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	r := &Receiver{log: f, path: path, secrets: map[string]*standardwebhooks.Webhook{},
		attempts: map[string]int{}, FailFirst: map[string]int{}, acked: map[string]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r.Port = ln.Addr().(*net.TCPAddr).Port
	r.serve(ln)
	return r, nil
}

// URL of subscription sub's endpoint.
func (r *Receiver) URL(sub string) string {
	return fmt.Sprintf("http://127.0.0.1:%d/hook/%s", r.Port, sub)
}

// SetSecret gives the receiver sub's signing secret.
func (r *Receiver) SetSecret(sub, secret string) error {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.secrets[sub] = wh
	r.mu.Unlock()
	return nil
}

func (r *Receiver) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(r.handle), ReadHeaderTimeout: 5 * time.Second}
	r.mu.Lock()
	r.srv, r.ln = srv, ln
	r.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// Down closes the listener and every open connection; Up listens again on
// the same port.
func (r *Receiver) Down() {
	r.mu.Lock()
	srv := r.srv
	r.srv = nil
	r.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// Up listens again (retrying while the port is in TIME_WAIT reuse limbo).
func (r *Receiver) Up() error {
	var err error
	for i := 0; i < 100; i++ {
		var ln net.Listener
		ln, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", r.Port))
		if err == nil {
			r.serve(ln)
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

// Counts returns requests seen and 2xx answered.
func (r *Receiver) Counts() (requests, ok int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count, r.ok
}

func (r *Receiver) handle(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	sub, found := strings.CutPrefix(req.URL.Path, "/hook/")
	body, err := io.ReadAll(io.LimitReader(req.Body, 4<<20))
	if !found || err != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	wh := r.secrets[sub]
	status := http.StatusNoContent
	switch {
	case wh == nil:
		status = http.StatusNotFound
	case wh.Verify(body, req.Header) != nil:
		status = http.StatusUnauthorized
	default:
		k := sub + "/" + req.Header.Get(contract.HeaderWebhookID)
		r.attempts[k]++
		if r.attempts[k] <= r.FailFirst[sub] {
			status = http.StatusInternalServerError
		}
	}
	line := Line{Sub: sub, WebhookID: req.Header.Get(contract.HeaderWebhookID), Timestamp: req.Header.Get(contract.HeaderWebhookTimestamp),
		Signature: req.Header.Get(contract.HeaderWebhookSignature), Body: string(body), Start: start, End: time.Now(), Status: status}
	b, _ := json.Marshal(line)
	_, werr := r.log.Write(append(b, '\n'))
	r.count++
	if status < 300 && werr == nil {
		r.ok++
		r.acked[sub+"/"+line.WebhookID] = true
	}
	r.mu.Unlock()
	if werr != nil {
		// Not logged: do not acknowledge.
		http.Error(w, "log write failed", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(status)
}

// Acked is the number of distinct (subscription, event) pairs answered 2xx.
func (r *Receiver) Acked() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.acked)
}

// Close stops serving and closes the log.
func (r *Receiver) Close() {
	r.Down()
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.log.Close()
}

// ReadReceipts parses a receiver log into the judge's receipts.
func ReadReceipts(path string) ([]judge.Receipt, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []judge.Receipt
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 8<<20)
	for sc.Scan() {
		var l Line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("receiver log line %d: %w", len(out)+1, err)
		}
		out = append(out, judge.Receipt{Subscription: l.Sub, WebhookID: l.WebhookID, Timestamp: l.Timestamp,
			Signature: l.Signature, Body: []byte(l.Body), Start: l.Start, End: l.End, Status: l.Status})
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return out, nil
}
