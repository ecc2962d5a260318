package adminapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
)

// Authenticator checks ADMIN_TOKEN. The admin API (a bearer header) and the
// console (internal/console: a sign-in form) both check through it, so a
// wrong token is logged and counted the same way wherever it is tried: an
// operator looking for token guessing finds it in one place.
type Authenticator struct {
	// digest is sha256(ADMIN_TOKEN); the token itself is not kept.
	digest   [sha256.Size]byte
	log      *slog.Logger
	rejected atomic.Int64
}

// NewAuthenticator checks against token (trimmed).
func NewAuthenticator(token string, logger *slog.Logger) *Authenticator {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Authenticator{digest: sha256.Sum256([]byte(strings.TrimSpace(token))), log: logger}
}

// Valid compares token with ADMIN_TOKEN in constant time. Both sides are
// hashed first: subtle.ConstantTimeCompare returns at once on a length
// mismatch, which would reveal the token's length. An empty token is never
// valid.
func (a *Authenticator) Valid(token string) bool {
	token = strings.TrimSpace(token)
	if token == "" {
		return false
	}
	got := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(got[:], a.digest[:]) == 1
}

// Reject records a request that presented no or a wrong token: one warning
// (never the token) and one count. surface is "api" or "console".
func (a *Authenticator) Reject(r *http.Request, surface string) {
	a.rejected.Add(1)
	a.log.WarnContext(r.Context(), "admin authentication failed", "surface", surface,
		"method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
}

// Rejected is how many requests Reject recorded.
func (a *Authenticator) Rejected() int64 { return a.rejected.Load() }

// BearerToken returns the token of an "Authorization: Bearer <token>"
// header ("" when there is none).
func BearerToken(r *http.Request) string {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}
