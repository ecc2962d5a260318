package adminapi

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// AuthMetrics counts rejected requests (bridge_admin_auth_failures_total);
// metrics.Admin implements it.
type AuthMetrics interface{ AuthFailure() }

// rejectionLog logs rejected requests, at most one line per source address
// per second. A 401 that leaves no trace lets a token guessed at or a
// client with a stale token go unseen; one line per request would let
// the guesser fill the log instead. The line carries how many requests the
// source had rejected since its previous line.
type rejectionLog struct {
	log *slog.Logger
	now func() time.Time

	mu      sync.Mutex
	sources map[string]*rejectedSource
}

type rejectedSource struct {
	logged     time.Time // when the source's last line was written
	suppressed int       // rejections since then, not yet in a line
}

// maxRejectionSources bounds the map: addresses are cheap to vary, so
// past this many the oldest bookkeeping is dropped (at worst a source gets
// a second line within its second).
const maxRejectionSources = 4096

func newRejectionLog(log *slog.Logger) *rejectionLog {
	return &rejectionLog{log: log, now: time.Now, sources: map[string]*rejectedSource{}}
}

// reject records one rejected request.
func (l *rejectionLog) reject(ctx context.Context, r *http.Request, reason string) {
	source, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		source = r.RemoteAddr
	}
	now := l.now()
	l.mu.Lock()
	s := l.sources[source]
	if s != nil && now.Sub(s.logged) < time.Second {
		s.suppressed++
		l.mu.Unlock()
		return
	}
	if s == nil {
		if len(l.sources) >= maxRejectionSources {
			for k, v := range l.sources {
				if now.Sub(v.logged) >= time.Second {
					delete(l.sources, k)
				}
			}
			if len(l.sources) >= maxRejectionSources {
				clear(l.sources)
			}
		}
		s = &rejectedSource{}
		l.sources[source] = s
	}
	count := s.suppressed + 1
	s.logged, s.suppressed = now, 0
	l.mu.Unlock()
	l.log.WarnContext(ctx, "admin API request rejected", "source", source, "method", r.Method, "path", r.URL.Path,
		"reason", reason, "rejected", count)
}
