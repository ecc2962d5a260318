package demo

import (
	"bytes"
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
		req.Header.Set("webhook-signature", sig)
	}
	if r.tamper != nil {
		body = r.tamper(body)
	}
	req.Body = httpBody(body)
	req.Header.Set("webhook-id", r.id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(at.Unix(), 10))
	req.Header.Set("content-type", "application/json")
	if r.traceID != "" {
		req.Header.Set("traceparent", "00-"+r.traceID+"-00f067aa0ba902b7-01")
	}
	return req
}

func httpBody(b []byte) *readCloser { return &readCloser{bytes.NewReader(b)} }

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

func send(t *testing.T, rv *Receiver, r request) int {
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
			rv, err := NewReceiver(secret)
			if err != nil {
				t.Fatal(err)
			}
			tc.req.id, tc.req.asset, tc.req.assetSeq = newID(), &asset, 1
			if code := send(t, rv, tc.req); code != tc.code {
				t.Errorf("status = %d, want %d", code, tc.code)
			}
			st := rv.Stats()
			if st.SignatureFailures != tc.sigFail {
				t.Errorf("signature failures = %d, want %d", st.SignatureFailures, tc.sigFail)
			}
			if want := 1 - tc.sigFail; st.Delivered != want {
				t.Errorf("delivered = %d, want %d (a request that fails verification must not count)", st.Delivered, want)
			}
			if tc.sigFail > 0 && (len(st.Examples) != 1 || !strings.Contains(st.Examples[0], tc.req.id)) {
				t.Errorf("examples = %q, want one naming webhook-id %s", st.Examples, tc.req.id)
			}
		})
	}
}

func TestReceiverOrderCheck(t *testing.T) {
	t.Parallel()
	secret := store.NewSecret()
	a, b := "asset-a", "asset-b"
	rv, err := NewReceiver(secret)
	if err != nil {
		t.Fatal(err)
	}
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
		if st.OrderViolations != s.violations || st.Delivered != s.delivered || st.Duplicates != s.duplicates {
			t.Fatalf("%s: violations/delivered/duplicates = %d/%d/%d, want %d/%d/%d",
				s.name, st.OrderViolations, st.Delivered, st.Duplicates, s.violations, s.delivered, s.duplicates)
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
	secret := store.NewSecret()
	rv, err := NewReceiver(secret)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rv.now = func() time.Time { return at }
	id, asset := newID(), "asset-1"
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	send(t, rv, request{id: id, asset: &asset, assetSeq: 1, secret: secret, traceID: traceID})
	got, ok := rv.arrival(id)
	if !ok || !got.at.Equal(at) || got.traceID != traceID {
		t.Errorf("arrival = %+v, %v; want at %v with trace %s", got, ok, at, traceID)
	}
}

func TestReceiverRejectsSignedNonEnvelope(t *testing.T) {
	t.Parallel()
	secret := store.NewSecret()
	rv, err := NewReceiver(secret)
	if err != nil {
		t.Fatal(err)
	}
	id := newID()
	body := []byte(`{"hello":"world"}`)
	now := time.Now().Unix()
	sig, _ := delivery.Sign([]string{secret}, id, now, body)
	req := httptest.NewRequest(http.MethodPost, "/webhooks", bytes.NewReader(body))
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now, 10))
	req.Header.Set("webhook-signature", sig)
	w := httptest.NewRecorder()
	rv.ServeHTTP(w, req)
	if w.Code != http.StatusBadRequest {
		t.Errorf("status = %d, want 400", w.Code)
	}
	if st := rv.Stats(); st.Malformed != 1 || st.Delivered != 0 {
		t.Errorf("stats = %+v, want 1 malformed, 0 delivered", st)
	}
}
