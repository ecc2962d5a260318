package adminapi

import (
	"crypto/sha256"
	"log/slog"
	"net/http"
	"strings"
)

// Authenticator checks ADMIN_TOKEN where it arrives other than as the API's
// bearer header — the console's sign-in form (internal/console) — and
// records a wrong one exactly as the API records a rejected request: the
// same rate-limited log line and the same counter
// (bridge_admin_auth_failures_total), so token guessing shows in one place
// whichever door it tries.
type Authenticator struct {
	// digest is sha256(ADMIN_TOKEN); the token itself is not kept.
	digest     [sha256.Size]byte
	rejections *rejectionLog
	metrics    AuthMetrics
}

// NewAuthenticator checks against token; metrics may be nil (not counted).
func NewAuthenticator(token string, logger *slog.Logger, metrics AuthMetrics) *Authenticator {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Authenticator{digest: sha256.Sum256([]byte(strings.TrimSpace(token))), rejections: newRejectionLog(logger), metrics: metrics}
}

// Valid compares token with ADMIN_TOKEN (tokenMatches: constant time, a
// blank token never matches).
func (a *Authenticator) Valid(token string) bool { return tokenMatches(token, a.digest) }

// Reject records one request refused for its token.
func (a *Authenticator) Reject(r *http.Request, reason string) {
	if a.metrics != nil {
		a.metrics.AuthFailure()
	}
	a.rejections.reject(r.Context(), r, reason)
}
