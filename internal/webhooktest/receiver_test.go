package webhooktest_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/webhooktest"
)

// request is one webhook as the deliverer would send it, signed with the
// bridge's own signing code (the receiver verifies with the standardwebhooks
// library: the two must agree).
type request struct {
	id       string
	asset    *string
	assetSeq int64
	secret   string    // signs; "" leaves the signature header out
	at       time.Time // webhook-timestamp; zero: now
	tamper   func(body []byte) []byte
	traceID  string
}

func (r request) build(t *testing.T) *http.Request {
	t.Helper()
	seq := r.assetSeq
	body, err := contract.NewEnvelope(r.id, "asset.version_published", r.asset, &seq, time.Now(), []byte(`{"version":2}`)).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	at := r.at
	if at.IsZero() {
		at = time.Now()
	}
	req := httptest.NewRequest(http.MethodPost, "/webhooks", nil)
	if r.secret != "" {
		sig, err := delivery.Sign([]string{r.secret}, r.id, at.Unix(), body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(contract.HeaderWebhookSignature, sig)
	}
	if r.tamper != nil {
		body = r.tamper(body)
	}
	req.Body = httpBody(body)
	req.Header.Set(contract.HeaderWebhookID, r.id)
	req.Header.Set(contract.HeaderWebhookTimestamp, strconv.FormatInt(at.Unix(), 10))
	req.Header.Set(contract.HeaderContentType, contract.ContentTypeJSON)
	if r.traceID != "" {
		req.Header.Set(contract.HeaderTraceparent, "00-"+r.traceID+"-00f067aa0ba902b7-01")
	}
	return req
}

func httpBody(b []byte) *readCloser { return &readCloser{bytes.NewReader(b)} }

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

func send(t *testing.T, rv *webhooktest.Receiver, r request) int {
	t.Helper()
	w := httptest.NewRecorder()
	rv.ServeHTTP(w, r.build(t))
	return w.Code
}

func newID() string { return uuid.NewString() }

func TestReceiverSignatureCheck(t *testing.T) {
	t.Parallel()
	secret := store.NewSecret()
	asset := "asset-0001"
	cases := []struct {
		name    string
		req     request
		code    int
		sigFail int
	}{
		{"valid", request{secret: secret}, http.StatusNoContent, 0},
		{"body tampered after signing", request{secret: secret, tamper: func(b []byte) []byte {
			return bytes.Replace(b, []byte(`"version":2`), []byte(`"version":3`), 1)
		}}, http.StatusUnauthorized, 1},
		{"signed with another secret", request{secret: store.NewSecret()}, http.StatusUnauthorized, 1},
		{"no signature", request{}, http.StatusUnauthorized, 1},
		{"timestamp an hour old", request{secret: secret, at: time.Now().Add(-time.Hour)}, http.StatusUnauthorized, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rv := receiverFor(t, secret)
			tc.req.id, tc.req.asset, tc.req.assetSeq = newID(), &asset, 1
			if code := send(t, rv, tc.req); code != tc.code {
				t.Errorf("status = %d, want %d", code, tc.code)
			}
			st := rv.Stats()
			if st.SignatureFailures != tc.sigFail {
				t.Errorf("signature failures = %d, want %d", st.SignatureFailures, tc.sigFail)
			}
			if want := 1 - tc.sigFail; st.Accepted != want {
				t.Errorf("delivered = %d, want %d (a request that fails verification must not count)", st.Accepted, want)
			}
			if tc.sigFail > 0 && (len(st.Examples) != 1 || !strings.Contains(st.Examples[0], tc.req.id)) {
				t.Errorf("examples = %q, want one naming webhook-id %s", st.Examples, tc.req.id)
			}
		})
	}
}

func TestReceiverOrderCheck(t *testing.T) {
	t.Parallel()
	rv, secret := newTestReceiver(t)
	a, b := "asset-a", "asset-b"
	first := newID()
	steps := []struct {
		name       string
		req        request
		violations int
		delivered  int
		duplicates int
	}{
		{"a:1", request{id: first, asset: &a, assetSeq: 1}, 0, 1, 0},
		{"a:2", request{id: newID(), asset: &a, assetSeq: 2}, 0, 2, 0},
		{"b:1 — another asset has its own order", request{id: newID(), asset: &b, assetSeq: 1}, 0, 3, 0},
		{"null:7 — the null asset is a stream of its own", request{id: newID(), assetSeq: 7}, 0, 4, 0},
		{"a:1 again with the same webhook-id — a duplicate, not a violation", request{id: first, asset: &a, assetSeq: 1}, 0, 4, 1},
		{"a:1 with a new id — out of order", request{id: newID(), asset: &a, assetSeq: 1}, 1, 5, 1},
		{"a:2 with a new id — not strictly increasing", request{id: newID(), asset: &a, assetSeq: 2}, 2, 6, 1},
		{"a:4 — a gap is not an order violation (a parked row leaves one)", request{id: newID(), asset: &a, assetSeq: 4}, 2, 7, 1},
		{"null:6 — behind the null stream", request{id: newID(), assetSeq: 6}, 3, 8, 1},
	}
	for _, s := range steps {
		s.req.secret = secret
		if code := send(t, rv, s.req); code != http.StatusNoContent {
			t.Fatalf("%s: status = %d, want 204 (violations are counted, not refused)", s.name, code)
		}
		st := rv.Stats()
		if st.OrderViolations != s.violations || st.Accepted != s.delivered || st.Duplicates != s.duplicates {
			t.Fatalf("%s: violations/delivered/duplicates = %d/%d/%d, want %d/%d/%d",
				s.name, st.OrderViolations, st.Accepted, st.Duplicates, s.violations, s.delivered, s.duplicates)
		}
		if st.SignatureFailures != 0 {
			t.Fatalf("%s: signature failures = %d", s.name, st.SignatureFailures)
		}
	}
	ex := rv.Stats().Examples
	if len(ex) != 3 || !strings.Contains(ex[0], "asset asset-a: asset_seq 1") || !strings.Contains(ex[2], "asset (null)") {
		t.Errorf("examples = %q", ex)
	}
}

func TestReceiverRecordsArrivalAndTrace(t *testing.T) {
	t.Parallel()
	rv, secret := newTestReceiver(t)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rv.Now = func() time.Time { return at }
	id, asset := newID(), "asset-1"
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	send(t, rv, request{id: id, asset: &asset, assetSeq: 1, secret: secret, traceID: traceID})
	got, ok := rv.Arrival("/webhooks", id)
	if !ok || !got.At.Equal(at) || got.TraceID != traceID {
		t.Errorf("arrival = %+v, %v; want at %v with trace %s", got, ok, at, traceID)
	}
}

func TestReceiverRejectsSignedNonEnvelope(t *testing.T) {
	t.Parallel()
	rv, secret := newTestReceiver(t)
	id := newID()
	body := []byte(`{"hello":"world"}`)
	now := time.Now().Unix()
	sig, _ := delivery.Sign([]string{secret}, id, now, body)
	req := httptest.NewRequest(http.MethodPost, "/webhooks", bytes.NewReader(body))
	req.Header.Set(contract.HeaderWebhookID, id)
	req.Header.Set(contract.HeaderWebhookTimestamp, strconv.FormatInt(now, 10))
	req.Header.Set(contract.HeaderWebhookSignature, sig)
	w := httptest.NewRecorder()
	rv.ServeHTTP(w, req)
	if w.Code != http.StatusBadRequest {
		t.Errorf("status = %d, want 400", w.Code)
	}
	if st := rv.Stats(); st.Malformed != 1 || st.Accepted != 0 {
		t.Errorf("stats = %+v, want 1 malformed, 0 delivered", st)
	}
}

// Two requests of one (subscription, asset) stream in flight at once are an
// overlap; a request of another asset, or after the first was answered, is
// not.
func TestReceiverDetectsOverlappingRequests(t *testing.T) {
	t.Parallel()
	rv, secret := newTestReceiver(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 4)
	rv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if *r.Envelope.AssetSeq == 1 {
			entered <- struct{}{}
			<-release
		}
		return http.StatusNoContent, 0
	}
	a, b := "asset-a", "asset-b"
	done := make(chan int)
	go func() { done <- send(t, rv, request{id: newID(), asset: &a, assetSeq: 1, secret: secret}) }()
	<-entered
	if code := send(t, rv, request{id: newID(), asset: &b, assetSeq: 2, secret: secret}); code != http.StatusNoContent {
		t.Fatalf("other asset: %d", code)
	}
	if st := rv.Stats(); st.Overlaps != 0 {
		t.Fatalf("overlaps = %d after a request of another asset, want 0", st.Overlaps)
	}
	if code := send(t, rv, request{id: newID(), asset: &a, assetSeq: 2, secret: secret}); code != http.StatusNoContent {
		t.Fatalf("same asset: %d", code)
	}
	close(release)
	<-done
	if code := send(t, rv, request{id: newID(), asset: &a, assetSeq: 3, secret: secret}); code != http.StatusNoContent {
		t.Fatalf("after the answer: %d", code)
	}
	st := rv.Stats()
	if st.Overlaps != 1 || len(st.Examples) != 2 || !strings.Contains(st.Examples[1], "overlap: subscription /webhooks asset asset-a") {
		t.Errorf("overlaps = %d, examples %q; want 1 naming asset-a", st.Overlaps, st.Examples)
	}
	// asset-a:2 was acknowledged before asset-a:1 (the overlap let it
	// overtake): that is an order violation too.
	if st.OrderViolations != 1 {
		t.Errorf("order violations = %d, want 1", st.OrderViolations)
	}
}

// A request answered non-2xx on purpose is not an acknowledged event: its
// retry is the first copy, not a duplicate; Observe sees every request, with
// its answer, before the answer is sent.
func TestReceiverRespondAndObserve(t *testing.T) {
	t.Parallel()
	rv, secret := newTestReceiver(t)
	rv.Respond = func(r *webhooktest.Request) (int, time.Duration) {
		if r.Attempt == 1 {
			return http.StatusServiceUnavailable, 0
		}
		return http.StatusOK, 5 * time.Millisecond
	}
	var seen []string
	rv.Observe = func(r *webhooktest.Request) {
		seen = append(seen, fmt.Sprintf("%d:%d:%s", r.Attempt, r.Status, r.Outcome))
		if r.Answered.Before(r.Received) {
			t.Errorf("answered %v before received %v", r.Answered, r.Received)
		}
	}
	a := "asset-a"
	id := newID()
	if code := send(t, rv, request{id: id, asset: &a, assetSeq: 1, secret: secret}); code != http.StatusServiceUnavailable {
		t.Fatalf("first attempt: %d, want 503", code)
	}
	if code := send(t, rv, request{id: id, asset: &a, assetSeq: 1, secret: secret}); code != http.StatusOK {
		t.Fatalf("second attempt: %d, want 200", code)
	}
	if code := send(t, rv, request{id: id, asset: &a, assetSeq: 1, secret: secret}); code != http.StatusOK {
		t.Fatalf("third attempt: %d, want 200", code)
	}
	if want := []string{"1:503:refused", "2:200:accepted", "3:200:duplicate"}; strings.Join(seen, " ") != strings.Join(want, " ") {
		t.Errorf("observed %q, want %q", seen, want)
	}
	st := rv.Stats()
	if st.Accepted != 1 || st.Duplicates != 1 || st.Refused != 1 || st.Requests != 3 || st.OrderViolations != 0 {
		t.Errorf("stats %+v", st)
	}
	if n := rv.Attempts("/webhooks", id); n != 3 {
		t.Errorf("attempts = %d, want 3", n)
	}
}

// Gapless: each stream starts at 1 and goes up by one; a gap means an earlier
// event would arrive out of order.
func TestReceiverGapless(t *testing.T) {
	t.Parallel()
	rv, secret := newTestReceiver(t)
	rv.Gapless = true
	a, b := "asset-a", "asset-b"
	for _, s := range []struct {
		asset      *string
		seq        int64
		violations int
	}{
		{&a, 1, 0}, {&a, 2, 0}, {&a, 4, 1}, {&a, 5, 1}, {&b, 2, 2}, {&b, 3, 2}, {&a, 3, 3},
	} {
		send(t, rv, request{id: newID(), asset: s.asset, assetSeq: s.seq, secret: secret})
		if st := rv.Stats(); st.OrderViolations != s.violations {
			t.Fatalf("%s:%d: violations = %d, want %d", *s.asset, s.seq, st.OrderViolations, s.violations)
		}
	}
}

// Bounded keeps a hash per event instead of the per-event maps: on gapless
// streams it must count exactly what the exact receiver counts — repeats of
// an acknowledged webhook-id are duplicates, and another event at or below
// the last asset_seq, a gap, or a first asset_seq above 1 are violations.
func TestReceiverBoundedCountsAsExact(t *testing.T) {
	t.Parallel()
	a, b := "asset-a", "asset-b"
	a1, a2, a4, n1 := newID(), newID(), newID(), newID()
	steps := []struct {
		name  string
		req   request
		viol  int
		acked int
		dups  int
	}{
		{"a:1", request{id: a1, asset: &a, assetSeq: 1}, 0, 1, 0},
		{"a:2", request{id: a2, asset: &a, assetSeq: 2}, 0, 2, 0},
		{"a:1 again, same webhook-id", request{id: a1, asset: &a, assetSeq: 1}, 0, 2, 1},
		{"a:2 again, same webhook-id", request{id: a2, asset: &a, assetSeq: 2}, 0, 2, 2},
		{"a:1 with another webhook-id", request{id: newID(), asset: &a, assetSeq: 1}, 1, 3, 2},
		{"a:4, a gap", request{id: a4, asset: &a, assetSeq: 4}, 2, 4, 2},
		{"a:3 late", request{id: newID(), asset: &a, assetSeq: 3}, 3, 5, 2},
		{"a:4 again, same webhook-id", request{id: a4, asset: &a, assetSeq: 4}, 3, 5, 3},
		{"b:2 first", request{id: newID(), asset: &b, assetSeq: 2}, 4, 6, 3},
		{"b:3", request{id: newID(), asset: &b, assetSeq: 3}, 4, 7, 3},
		{"b:1 late, never acknowledged", request{id: newID(), asset: &b, assetSeq: 1}, 5, 8, 3},
		{"null:1", request{id: n1, assetSeq: 1}, 5, 9, 3},
		{"null:1 again, same webhook-id", request{id: n1, assetSeq: 1}, 5, 9, 4},
	}
	exact, secret := newTestReceiver(t)
	exact.Gapless = true
	bounded := receiverFor(t, secret)
	bounded.Bounded = true
	for _, s := range steps {
		s.req.secret = secret
		for mode, rv := range map[string]*webhooktest.Receiver{"exact": exact, "bounded": bounded} {
			if code := send(t, rv, s.req); code != http.StatusNoContent {
				t.Fatalf("%s (%s): status = %d, want 204", s.name, mode, code)
			}
			if st := rv.Stats(); st.OrderViolations != s.viol || st.Accepted != s.acked || st.Duplicates != s.dups {
				t.Fatalf("%s (%s): violations/accepted/duplicates = %d/%d/%d, want %d/%d/%d",
					s.name, mode, st.OrderViolations, st.Accepted, st.Duplicates, s.viol, s.acked, s.dups)
			}
		}
	}
	if _, ok := bounded.Arrival("/webhooks", a1); ok {
		t.Error("Bounded kept a per-event arrival")
	}
}

// Each subscription verifies with its own secret; a subscription without one
// is answered 503 (the bridge retries) until it is set.
func TestReceiverPerSubscriptionSecrets(t *testing.T) {
	t.Parallel()
	s1, s2 := store.NewSecret(), store.NewSecret()
	rv := webhooktest.New()
	rv.StreamOf = func(r *http.Request) string { return r.Header.Get("x-sub") }
	if rv.Ready() {
		t.Fatal("ready with no secret")
	}
	if err := rv.SetSecret("one", s1); err != nil {
		t.Fatal(err)
	}
	a := "asset"
	post := func(sub, secret string) int {
		req := request{id: newID(), asset: &a, assetSeq: 1, secret: secret}.build(t)
		req.Header.Set("x-sub", sub)
		w := httptest.NewRecorder()
		rv.ServeHTTP(w, req)
		return w.Code
	}
	if code := post("one", s1); code != http.StatusNoContent {
		t.Errorf("subscription one with its secret: %d", code)
	}
	if code := post("two", s2); code != http.StatusServiceUnavailable {
		t.Errorf("subscription two before its secret: %d, want 503", code)
	}
	if err := rv.SetSecret("two", s2); err != nil {
		t.Fatal(err)
	}
	if code := post("two", s1); code != http.StatusUnauthorized {
		t.Errorf("subscription two signed with one's secret: %d, want 401", code)
	}
	if code := post("two", s2); code != http.StatusNoContent {
		t.Errorf("subscription two with its secret: %d", code)
	}
	if st := rv.Stats(); st.Accepted != 2 || st.NotReady != 1 || st.SignatureFailures != 1 {
		t.Errorf("stats %+v", st)
	}
}

// newTestReceiver is a receiver verifying with a fresh secret, and the
// secret to sign with.
func newTestReceiver(t *testing.T) (*webhooktest.Receiver, string) {
	t.Helper()
	secret := store.NewSecret()
	return receiverFor(t, secret), secret
}

// receiverFor is a receiver verifying with secret.
func receiverFor(t *testing.T, secret string) *webhooktest.Receiver {
	t.Helper()
	rv, err := webhooktest.NewWithSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	return rv
}
