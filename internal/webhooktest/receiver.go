// Package webhooktest is the one webhook receiver of the repository: the demo,
// the docker compose sample receiver, the delivery benchmark and the tests all
// check what the deliverer sent with it, so a bug in the bridge cannot hide
// behind a lenient copy of the checks.
//
// For every request a Receiver
//
//  1. verifies the Standard Webhooks signature with the official library
//     (and the timestamp within its ±5 minutes), using the secret of the
//     request's subscription — 401 when it does not verify, 503 while the
//     receiver has no secret for it yet (the bridge retries);
//  2. parses the body as the contract's envelope (contract.ParseEnvelope) and
//     checks its id is the webhook-id — 400 otherwise: signed by the bridge
//     but not its envelope is a bug that no retry fixes;
//  3. notes whether another request of the same (subscription, asset) stream
//     is still in flight — the bridge promises one at a time;
//  4. asks Respond for the answer (fail or slow chosen requests);
//  5. for a 2xx answer: ignores a webhook-id the subscription already
//     acknowledged (a duplicate, allowed: at least once), and otherwise checks
//     that asset_seq is above the last one acknowledged on the stream (the null
//     asset is a stream of its own) — a violation is counted, not refused, so
//     a run shows every violation rather than the first;
//  6. calls Observe with the whole record before it answers, so a log written
//     there cannot miss a 2xx the receiver gave even if it is killed next.
//
// By default the receiver keeps every (subscription, webhook-id) it saw: the
// exact duplicate check for streams that may have gaps, Arrival and Attempts.
// That grows by a few hundred bytes of pointer-holding map per webhook, which
// a long benchmark cannot afford (a gigabyte in ten minutes at 3,000/s, and
// the garbage collector scanning it on the cores being measured); Bounded
// keeps eight pointer-free bytes per event instead (see Bounded).
package webhooktest

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/outboxbridge/bridge/internal/contract"
)

// DefaultMaxBody bounds what is read of one request. The relay parks anything
// over RELAY_MAX_MESSAGE_BYTES, so a legitimate body is far smaller; a larger
// one is answered 413.
const DefaultMaxBody = 4 << 20

// keptExamples is how many problems of each kind are described in full.
const keptExamples = 10

// Outcome is what the receiver made of a request.
type Outcome string

const (
	Accepted     Outcome = "accepted"      // 2xx, first copy of the event
	Duplicate    Outcome = "duplicate"     // 2xx, webhook-id already acknowledged
	Refused      Outcome = "refused"       // verified, but Respond chose a non-2xx answer
	BadSignature Outcome = "bad_signature" // 401
	Malformed    Outcome = "malformed"     // 400 (not the envelope) or 413 (too large)
	NotReady     Outcome = "not_ready"     // 503: no secret for the subscription yet
)

// Request is one request as the receiver saw it.
type Request struct {
	Subscription string // StreamOf's answer (by default the URL path)
	WebhookID    string
	Timestamp    string // webhook-timestamp
	Signature    string // webhook-signature
	Traceparent  string
	Body         []byte
	// Envelope is the parsed body (zero unless the signature verified).
	Envelope contract.Envelope
	Received time.Time // when the request arrived
	// Answered is when the answer was decided (after Respond's delay).
	Answered time.Time
	Status   int
	Outcome  Outcome
	// Overlap: another request of the same (subscription, asset) stream was
	// in flight when this one arrived.
	Overlap bool
	// OrderViolation describes the violation ("" when in order).
	OrderViolation string
	// Attempt counts the requests with this webhook-id on this subscription,
	// this one included (1 for the first).
	Attempt int
}

// TraceID is the trace id of the request's traceparent ("" if malformed).
// It reads the fields in place (every accepted request asks for it).
func (r *Request) TraceID() string {
	_, rest, ok1 := strings.Cut(r.Traceparent, "-")
	id, rest, ok2 := strings.Cut(rest, "-")
	_, rest, ok3 := strings.Cut(rest, "-")
	if !ok1 || !ok2 || !ok3 || strings.Contains(rest, "-") || len(id) != 32 {
		return ""
	}
	return id
}

// Stats is what the receiver has seen so far.
type Stats struct {
	Requests int // every request
	// Accepted is the number of distinct events acknowledged (2xx, valid
	// signature, per subscription).
	Accepted int
	// Duplicates: 2xx for a webhook-id the subscription had acknowledged.
	Duplicates int
	// OrderViolations: acknowledged events whose asset_seq was not above the
	// last one acknowledged on their stream (or, with Gapless, not the next
	// one). Must be 0.
	OrderViolations int
	// Overlaps: requests that arrived while another of their stream was in
	// flight. Must be 0.
	Overlaps int
	// SignatureFailures: requests whose signature (or its headers or
	// timestamp) did not verify. Must be 0.
	SignatureFailures int
	// Malformed: signed requests whose body was not the envelope, and bodies
	// too large or unreadable.
	Malformed int
	Refused   int // answered non-2xx on purpose (Respond)
	NotReady  int // arrived before the subscription's secret was known
	// Unsequenced: acknowledged events without an asset_seq (not produced by
	// the relay), which no order check applies to.
	Unsequenced int
	// Examples describe the first few order violations, overlaps and
	// signature failures, in that order.
	Examples []string
}

// Arrival is the first acknowledged copy of an event.
type Arrival struct {
	At      time.Time
	TraceID string
}

// Receiver is an http.Handler. Set the exported fields before it serves.
type Receiver struct {
	// StreamOf names the subscription a request is for (default: its URL
	// path, so one receiver can serve several subscriptions at /s/1, /s/2…).
	StreamOf func(*http.Request) string
	// Respond chooses the answer to a verified envelope (default 204, no
	// delay): fail or slow chosen requests. It must not keep the Request.
	Respond func(*Request) (status int, delay time.Duration)
	// Observe sees every request, with its outcome, before it is answered.
	Observe func(*Request)
	// Gapless also counts a gap as an order violation: each stream must
	// start at asset_seq 1 and go up by one (true when every event of every
	// asset is delivered, as in a benchmark; false when the receiver may
	// join late or a parked row may leave a gap).
	Gapless bool
	// Bounded keeps, per (subscription, asset) stream, only the last
	// asset_seq acknowledged and a 64-bit hash of each acknowledged
	// webhook-id indexed by asset_seq (8 bytes per event, nothing for the
	// garbage collector to scan), instead of a map entry per (subscription,
	// webhook-id). It implies Gapless, which is what makes it exact: every
	// asset_seq up to the last was acknowledged in order, so a 2xx for an
	// asset_seq at or below the last is a duplicate when its webhook-id is
	// the one acknowledged at that asset_seq, and an order violation when it
	// is not. For a benchmark's long runs, where every event of every asset
	// is delivered. Request.Attempt is 0, Arrival and Attempts report
	// nothing, and an event without asset_seq is accepted every time it
	// comes (no duplicate check applies to it).
	Bounded bool
	// MaxBody bounds a request body (default DefaultMaxBody).
	MaxBody int64
	// Now is the clock (default time.Now).
	Now func() time.Time

	mu        sync.Mutex
	verifiers map[string]*verifier // subscription ("" any) → verifier
	seen      map[eventKey]Arrival
	attempts  map[eventKey]int
	lastSeq   map[streamKey]int64
	acked     map[streamKey][]uint64 // Bounded: webhook-id hash by asset_seq-1
	inFlight  map[streamKey]int
	stats     Stats
	examples  [3][]string // order violations, overlaps, signature failures
}

type eventKey struct{ sub, id string }
type streamKey struct{ sub, asset string }

// New returns a receiver with no secrets yet (every request is answered 503
// until SetSecret).
func New() *Receiver {
	return &Receiver{
		verifiers: map[string]*verifier{},
		seen:      map[eventKey]Arrival{},
		attempts:  map[eventKey]int{},
		lastSeq:   map[streamKey]int64{},
		acked:     map[streamKey][]uint64{},
		inFlight:  map[streamKey]int{},
	}
}

// NewWithSecret returns a receiver that verifies every subscription's
// requests with secret ("whsec_…").
func NewWithSecret(secret string) (*Receiver, error) {
	r := New()
	return r, r.SetSecret("", secret)
}

// SetSecret sets the signing secret of subscription sub ("" for every
// subscription without one of its own).
func (r *Receiver) SetSecret(sub, secret string) error {
	wh, err := newVerifier(secret)
	if err != nil {
		return fmt.Errorf("webhook receiver secret: %w", err)
	}
	r.mu.Lock()
	r.verifiers[sub] = wh
	r.mu.Unlock()
	return nil
}

// Ready reports whether the receiver has a secret for any subscription.
func (r *Receiver) Ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.verifiers) > 0
}

func (r *Receiver) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Incoming is one request as a server hands it to Handle. ServeHTTP builds
// it from net/http; a server of another kind (the delivery benchmark's)
// builds it from its own request, so both check exactly the same way.
type Incoming struct {
	Method string
	// Subscription names the subscription the request is for (ServeHTTP:
	// StreamOf's answer).
	Subscription                                 string
	WebhookID, Timestamp, Signature, Traceparent string
	// Body is the request body, which Handle keeps (in Request.Body):
	// the caller must not reuse it.
	Body []byte
	// BodyErr: the body was larger than MaxBodyBytes or could not be read
	// (answered 413).
	BodyErr error
	// Done, when not nil, is closed when the request is abandoned: a delay
	// chosen by Respond ends early.
	Done <-chan struct{}
}

// MaxBodyBytes is the most a server reads of one body (MaxBody or
// DefaultMaxBody).
func (r *Receiver) MaxBodyBytes() int64 {
	if r.MaxBody > 0 {
		return r.MaxBody
	}
	return DefaultMaxBody
}

// ServeHTTP implements http.Handler.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	in := Incoming{
		Method:      req.Method,
		WebhookID:   req.Header.Get(contract.HeaderWebhookID),
		Timestamp:   req.Header.Get(contract.HeaderWebhookTimestamp),
		Signature:   req.Header.Get(contract.HeaderWebhookSignature),
		Traceparent: req.Header.Get(contract.HeaderTraceparent),
		Done:        req.Context().Done(),
	}
	if r.StreamOf != nil {
		in.Subscription = r.StreamOf(req)
	} else {
		in.Subscription = req.URL.Path
	}
	if req.Method == http.MethodPost {
		in.Body, in.BodyErr = readBody(w, req, r.MaxBodyBytes())
	}
	status, msg := r.Handle(&in)
	if status >= 200 && status < 300 {
		w.WriteHeader(status)
		return
	}
	http.Error(w, msg, status)
}

// Handle checks one request (see the package's description) and returns the
// answer to send: its status and, for an error, a short text. Observe has
// seen the request when it returns.
func (r *Receiver) Handle(in *Incoming) (status int, msg string) {
	rq := &Request{
		Subscription: in.Subscription,
		Received:     r.now(),
		WebhookID:    in.WebhookID,
		Timestamp:    in.Timestamp,
		Signature:    in.Signature,
		Traceparent:  in.Traceparent,
		Body:         in.Body,
	}
	status, msg = r.handle(in, rq)
	rq.Status = status
	if rq.Answered.IsZero() {
		rq.Answered = r.now()
	}
	if r.Observe != nil {
		r.Observe(rq)
	}
	return status, msg
}

// handle decides the answer; the stream's in-flight mark is released before
// it returns, before the server sends the answer, so the bridge's next
// request of the stream cannot be mistaken for an overlap.
func (r *Receiver) handle(in *Incoming, rq *Request) (int, string) {
	r.mu.Lock()
	r.stats.Requests++
	if in.Method != http.MethodPost {
		rq.Outcome = Malformed
		r.stats.Malformed++
		r.mu.Unlock()
		return http.StatusMethodNotAllowed, "POST only"
	}
	if in.BodyErr != nil {
		rq.Outcome = Malformed
		r.stats.Malformed++
		r.mu.Unlock()
		return http.StatusRequestEntityTooLarge, "body too large or unreadable"
	}
	v := r.verifiers[rq.Subscription]
	if v == nil {
		v = r.verifiers[""]
	}
	if v == nil {
		rq.Outcome = NotReady
		r.stats.NotReady++
		r.mu.Unlock()
		return http.StatusServiceUnavailable, "not subscribed yet"
	}
	r.mu.Unlock()
	body := in.Body
	if err := v.Verify(body, in.WebhookID, in.Timestamp, in.Signature, time.Now()); err != nil {
		rq.Outcome = BadSignature
		r.mu.Lock()
		r.stats.SignatureFailures++
		r.example(2, fmt.Sprintf("signature: webhook-id %q: %v", rq.WebhookID, err))
		r.mu.Unlock()
		return http.StatusUnauthorized, "signature does not verify"
	}
	env, err := contract.ParseEnvelope(body)
	if err != nil || env.ID != rq.WebhookID {
		rq.Outcome = Malformed
		r.count(func(s *Stats) { s.Malformed++ })
		return http.StatusBadRequest, "not a webhook envelope with id = webhook-id"
	}
	rq.Envelope = env
	stream := streamKey{rq.Subscription, env.AssetKey()}
	ev := eventKey{rq.Subscription, env.ID}

	r.mu.Lock()
	if !r.Bounded {
		r.attempts[ev]++
		rq.Attempt = r.attempts[ev]
	}
	if r.inFlight[stream] > 0 {
		rq.Overlap = true
		r.stats.Overlaps++
		r.example(1, fmt.Sprintf("overlap: subscription %s asset %s: asset_seq %s arrived while another request of the stream was in flight",
			rq.Subscription, displayAsset(env.AssetID), displaySeq(env.AssetSeq)))
	}
	r.inFlight[stream]++
	r.mu.Unlock()

	status, delay := http.StatusNoContent, time.Duration(0)
	if r.Respond != nil {
		status, delay = r.Respond(rq)
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-in.Done:
			t.Stop()
		}
	}
	rq.Answered = r.now()

	r.mu.Lock()
	defer r.mu.Unlock()
	r.inFlight[stream]--
	if status < 200 || status >= 300 {
		rq.Outcome = Refused
		r.stats.Refused++
		return status, "refused by the test"
	}
	if r.Bounded {
		r.acceptBounded(rq, env, stream)
		return status, ""
	}
	if _, dup := r.seen[ev]; dup {
		rq.Outcome = Duplicate
		r.stats.Duplicates++
		return status, ""
	}
	rq.Outcome = Accepted
	r.seen[ev] = Arrival{At: rq.Received, TraceID: rq.TraceID()}
	r.stats.Accepted++
	if env.AssetSeq == nil {
		r.stats.Unsequenced++
		return status, ""
	}
	seq := *env.AssetSeq
	last, ok := r.lastSeq[stream]
	switch {
	case ok && seq <= last:
		rq.OrderViolation = fmt.Sprintf("order: asset %s: asset_seq %d (%s) arrived after %d", displayAsset(env.AssetID), seq, env.Type, last)
	case r.Gapless && !ok && seq != 1:
		rq.OrderViolation = fmt.Sprintf("order: asset %s: first asset_seq is %d (%s), not 1: earlier events would arrive out of order", displayAsset(env.AssetID), seq, env.Type)
		r.lastSeq[stream] = seq
	case r.Gapless && ok && seq != last+1:
		rq.OrderViolation = fmt.Sprintf("order: asset %s: asset_seq %d (%s) arrived after %d: the events between would arrive out of order", displayAsset(env.AssetID), seq, env.Type, last)
		r.lastSeq[stream] = seq
	default:
		r.lastSeq[stream] = seq
	}
	if rq.OrderViolation != "" {
		r.stats.OrderViolations++
		r.example(0, rq.OrderViolation)
	}
	return status, ""
}

// acceptBounded records a 2xx with Bounded (see there); r.mu is held.
func (r *Receiver) acceptBounded(rq *Request, env contract.Envelope, stream streamKey) {
	if env.AssetSeq == nil {
		rq.Outcome = Accepted
		r.stats.Accepted++
		r.stats.Unsequenced++
		return
	}
	seq, h := *env.AssetSeq, idHash(env.ID)
	last, ok := r.lastSeq[stream]
	acked := r.acked[stream]
	switch {
	case ok && seq >= 1 && seq <= last && acked[seq-1] == h:
		rq.Outcome = Duplicate
		r.stats.Duplicates++
		return
	case ok && seq <= last:
		rq.OrderViolation = fmt.Sprintf("order: asset %s: asset_seq %d (%s, webhook-id %s) arrived after %d, and is not the event acknowledged at %d",
			displayAsset(env.AssetID), seq, env.Type, env.ID, last, seq)
	case !ok && seq != 1:
		rq.OrderViolation = fmt.Sprintf("order: asset %s: first asset_seq is %d (%s), not 1: earlier events would arrive out of order", displayAsset(env.AssetID), seq, env.Type)
	case ok && seq != last+1:
		rq.OrderViolation = fmt.Sprintf("order: asset %s: asset_seq %d (%s) arrived after %d: the events between would arrive out of order", displayAsset(env.AssetID), seq, env.Type, last)
	}
	rq.Outcome = Accepted
	r.stats.Accepted++
	if rq.OrderViolation != "" {
		r.stats.OrderViolations++
		r.example(0, rq.OrderViolation)
	}
	if seq > last || !ok {
		// A gap's missing asset_seqs keep hash 0, which no later copy matches:
		// they count as violations when they come (they were one already).
		if seq >= 1 && seq-int64(len(acked)) <= maxBoundedGap {
			for int64(len(acked)) < seq {
				acked = append(acked, 0)
			}
			acked[seq-1] = h
		}
		r.acked[stream] = acked
		r.lastSeq[stream] = seq
	}
}

// maxBoundedGap bounds what one absurd asset_seq (already a violation) can
// make Bounded allocate.
const maxBoundedGap = 1 << 20

// idHash is FNV-1a of a webhook-id, never 0 (0 marks an asset_seq not
// acknowledged).
func idHash(id string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= 1099511628211
	}
	return max(h, 1)
}

// readBody reads the request's body, at most limit bytes: into a buffer of
// its Content-Length when it is declared, so a body is not copied while the
// buffer grows.
func readBody(w http.ResponseWriter, req *http.Request, limit int64) ([]byte, error) {
	body := http.MaxBytesReader(w, req.Body, limit)
	if n := req.ContentLength; n > 0 && n <= limit {
		buf := make([]byte, n)
		// net/http's server body ends at the Content-Length.
		_, err := io.ReadFull(body, buf)
		return buf, err
	}
	return io.ReadAll(body)
}

func (r *Receiver) count(f func(*Stats)) {
	r.mu.Lock()
	f(&r.stats)
	r.mu.Unlock()
}

// example keeps the first few descriptions of a kind; r.mu is held.
func (r *Receiver) example(kind int, s string) {
	if len(r.examples[kind]) < keptExamples {
		r.examples[kind] = append(r.examples[kind], s)
	}
}

// Stats returns the counts so far.
func (r *Receiver) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	s.Examples = nil
	for _, ex := range r.examples {
		s.Examples = append(s.Examples, ex...)
	}
	return s
}

// Arrival returns when the first acknowledged copy of event id reached
// subscription sub, and the trace id it carried.
func (r *Receiver) Arrival(sub, id string) (Arrival, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.seen[eventKey{sub, id}]
	return a, ok
}

// Attempts returns how many requests with webhook-id id reached sub.
func (r *Receiver) Attempts(sub, id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts[eventKey{sub, id}]
}

func displayAsset(id *string) string {
	if id == nil {
		return "(null)"
	}
	return *id
}

func displaySeq(n *int64) string {
	if n == nil {
		return "(none)"
	}
	return fmt.Sprint(*n)
}
