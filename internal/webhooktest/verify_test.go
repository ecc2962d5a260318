package webhooktest

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/outboxbridge/bridge/internal/contract"
)

// The receiver's verifier gives the reference library's answer — accepted,
// or the same error — on good, tampered, stale, early and malformed
// requests, and with several signatures in the header.
func TestVerifierAgreesWithTheReference(t *testing.T) {
	t.Parallel()
	secret, other := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
	ref, _ := standardwebhooks.NewWebhook(secret)
	refOther, _ := standardwebhooks.NewWebhook(other)
	v, err := newVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	body := []byte(`{"id":"e1","type":"t","data":{"a":1}}`)
	sign := func(wh *standardwebhooks.Webhook, id string, at time.Time, b []byte) string {
		s, _ := wh.Sign(id, at, b)
		return s
	}
	good := sign(ref, "e1", now, body)
	cases := []struct {
		name         string
		id, ts, sig  string
		body         []byte
		wantAccepted bool
	}{
		{"signed", "e1", strconv.FormatInt(now.Unix(), 10), good, body, true},
		{"two signatures, the second ours", "e1", strconv.FormatInt(now.Unix(), 10), sign(refOther, "e1", now, body) + " " + good, body, true},
		{"only another secret's", "e1", strconv.FormatInt(now.Unix(), 10), sign(refOther, "e1", now, body), body, false},
		{"tampered body", "e1", strconv.FormatInt(now.Unix(), 10), good, []byte(`{"id":"e1"}`), false},
		{"another id", "e2", strconv.FormatInt(now.Unix(), 10), good, body, false},
		{"another timestamp", "e1", strconv.FormatInt(now.Unix()+1, 10), good, body, false},
		{"too old", "e1", strconv.FormatInt(now.Add(-6*time.Minute).Unix(), 10), sign(ref, "e1", now.Add(-6*time.Minute), body), body, false},
		{"too new", "e1", strconv.FormatInt(now.Add(6*time.Minute).Unix(), 10), sign(ref, "e1", now.Add(6*time.Minute), body), body, false},
		{"bad timestamp", "e1", "yesterday", good, body, false},
		{"no signature", "e1", strconv.FormatInt(now.Unix(), 10), "", body, false},
		{"no id", "", strconv.FormatInt(now.Unix(), 10), good, body, false},
		{"v2 only", "e1", strconv.FormatInt(now.Unix(), 10), "v2," + good[3:], body, false},
		{"no comma", "e1", strconv.FormatInt(now.Unix(), 10), "v1" + good[3:], body, false},
		{"a third field", "e1", strconv.FormatInt(now.Unix(), 10), good + ",x", body, true},
		{"empty parts around it", "e1", strconv.FormatInt(now.Unix(), 10), "  " + good + " ", body, true},
		{"empty second field", "e1", strconv.FormatInt(now.Unix(), 10), "v1,," + good[3:], body, false},
		{"a long id", strings.Repeat("i", 300), strconv.FormatInt(now.Unix(), 10), sign(ref, strings.Repeat("i", 300), now, body), body, true},
	}
	for _, tc := range cases {
		h := http.Header{}
		for k, val := range map[string]string{contract.HeaderWebhookID: tc.id, contract.HeaderWebhookTimestamp: tc.ts, contract.HeaderWebhookSignature: tc.sig} {
			if val != "" {
				h.Set(k, val)
			}
		}
		for range 2 { // the second check reuses the pooled HMAC
			got := v.Verify(tc.body, h.Get(contract.HeaderWebhookID), h.Get(contract.HeaderWebhookTimestamp),
				h.Get(contract.HeaderWebhookSignature), time.Now())
			want := ref.Verify(tc.body, h)
			if (got == nil) != tc.wantAccepted || (want == nil) != tc.wantAccepted {
				t.Fatalf("%s: verifier %v, reference %v; want accepted=%v", tc.name, got, want, tc.wantAccepted)
			}
			if got != nil && got.Error() != want.Error() {
				t.Fatalf("%s: verifier says %q, the reference %q", tc.name, got, want)
			}
		}
	}
}
