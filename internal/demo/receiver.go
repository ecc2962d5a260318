package demo

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// maxBodyBytes bounds what the receiver reads from one request. The relay
// parks anything over RELAY_MAX_MESSAGE_BYTES, so a legitimate body is far
// smaller; a larger one is answered 413 and counted as rejected.
const maxBodyBytes = 4 << 20

// keptProblems is how many order violations and signature failures the
// receiver describes in full; beyond that it only counts them.
const keptProblems = 10

// Receiver is the demo's webhook endpoint (an http.Handler). For every
// request it:
//
//  1. verifies the Standard Webhooks signature with the subscription's secret
//     (and the timestamp within the library's ±5 minutes) — a failure is
//     answered 401 and counted;
//  2. ignores a webhook-id it has already accepted (a retry after a lost
//     answer, or a duplicate the pipeline is allowed to send) — answered 204;
//  3. checks that asset_seq is strictly greater than the last one accepted for
//     the same asset (the null asset is one stream of its own) — a violation
//     is counted but the request is still answered 204, so the pipeline keeps
//     going and the summary shows every violation, not just the first.
//
// It records the receive time and the trace id of each first copy for the
// summary's latency and trace-continuity figures.
type Receiver struct {
	verifier *standardwebhooks.Webhook
	now      func() time.Time

	mu         sync.Mutex
	seen       map[string]received // webhook-id → first accepted copy
	lastSeq    map[string]int64    // asset key ("" null asset) → last asset_seq
	duplicates int
	violations []string
	nViolation int
	sigFails   []string
	nSigFail   int
	rejected   int // bodies that verified but could not be read as the contract's envelope
}

type received struct {
	at      time.Time
	traceID string
}

// ReceiverStats is what the receiver has seen so far.
type ReceiverStats struct {
	// Delivered is the number of distinct events accepted (signature valid).
	Delivered int
	// Duplicates: accepted signatures for a webhook-id already seen.
	Duplicates int
	// OrderViolations: events whose asset_seq was not above the last one of
	// their asset. Must be 0.
	OrderViolations int
	// SignatureFailures: requests whose signature (or its headers or
	// timestamp) did not verify. Must be 0.
	SignatureFailures int
	// Malformed: signed requests whose body was not the webhook envelope.
	Malformed int
	// Examples describe the first few violations and failures.
	Examples []string
}

// NewReceiver returns a receiver that verifies with secret ("whsec_…").
func NewReceiver(secret string) (*Receiver, error) {
	v, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return nil, fmt.Errorf("demo receiver secret: %w", err)
	}
	return &Receiver{
		verifier: v,
		now:      time.Now,
		seen:     make(map[string]received),
		lastSeq:  make(map[string]int64),
	}, nil
}

// envelope is the part of the webhook body the receiver checks.
type envelope struct {
	ID       string  `json:"id"`
	Type     string  `json:"type"`
	AssetID  *string `json:"asset_id"`
	AssetSeq *int64  `json:"asset_seq"`
}

// ServeHTTP implements http.Handler.
func (rv *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := rv.now()
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		rv.mu.Lock()
		rv.rejected++
		rv.mu.Unlock()
		http.Error(w, "body too large or unreadable", http.StatusRequestEntityTooLarge)
		return
	}
	id := r.Header.Get("webhook-id")
	if err := rv.verifier.Verify(body, r.Header); err != nil {
		rv.mu.Lock()
		rv.nSigFail++
		if len(rv.sigFails) < keptProblems {
			rv.sigFails = append(rv.sigFails, fmt.Sprintf("signature: webhook-id %q: %v", id, err))
		}
		rv.mu.Unlock()
		http.Error(w, "signature does not verify", http.StatusUnauthorized)
		return
	}
	var ev envelope
	if err := json.Unmarshal(body, &ev); err != nil || ev.ID != id || ev.AssetSeq == nil {
		rv.mu.Lock()
		rv.rejected++
		rv.mu.Unlock()
		// Signed by the bridge but not the contract's envelope: a bug, and
		// retrying will not fix it; 400 sends it to the dead letters.
		http.Error(w, "not a webhook envelope with id = webhook-id and asset_seq", http.StatusBadRequest)
		return
	}
	asset := ""
	if ev.AssetID != nil {
		asset = *ev.AssetID
	}

	rv.mu.Lock()
	defer rv.mu.Unlock()
	if _, dup := rv.seen[id]; dup {
		rv.duplicates++
		w.WriteHeader(http.StatusNoContent)
		return
	}
	rv.seen[id] = received{at: at, traceID: traceIDOf(r.Header.Get("traceparent"))}
	if last, ok := rv.lastSeq[asset]; ok && *ev.AssetSeq <= last {
		rv.nViolation++
		if len(rv.violations) < keptProblems {
			rv.violations = append(rv.violations, fmt.Sprintf("order: asset %s: asset_seq %d (%s) arrived after %d", displayAsset(ev.AssetID), *ev.AssetSeq, ev.Type, last))
		}
	} else {
		rv.lastSeq[asset] = *ev.AssetSeq
	}
	w.WriteHeader(http.StatusNoContent)
}

// Stats returns the counts so far.
func (rv *Receiver) Stats() ReceiverStats {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	ex := append(append([]string(nil), rv.violations...), rv.sigFails...)
	return ReceiverStats{
		Delivered:         len(rv.seen),
		Duplicates:        rv.duplicates,
		OrderViolations:   rv.nViolation,
		SignatureFailures: rv.nSigFail,
		Malformed:         rv.rejected,
		Examples:          ex,
	}
}

// arrival returns when the first copy of id was accepted and the trace id it
// carried.
func (rv *Receiver) arrival(id string) (received, bool) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	r, ok := rv.seen[id]
	return r, ok
}

// traceIDOf returns the trace id of a W3C traceparent ("" if malformed).
func traceIDOf(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		return ""
	}
	return parts[1]
}

func displayAsset(id *string) string {
	if id == nil {
		return "(null)"
	}
	return *id
}
