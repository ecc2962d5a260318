package fastlane

import "github.com/outboxbridge/bridge/internal/delivery"

// isolation is why a subscription is isolated on a partition, and whether
// its requests in flight there are cut (a slow endpoint) or may finish (a
// subscription holding the offset, whose requests are not slow).
type isolation struct {
	why string
	cut bool
}

// cutRequest cuts s's request in flight (its subscription was isolated for
// a slow endpoint): the worker is free at once instead of waiting out the
// endpoint's answer, and the head goes to the slow lane first, the rest of
// the stream behind it (cutDone), so order per stream holds. The slow lane
// sends the head again with the same webhook-id: an endpoint that received
// the cut request sees it twice (at least once). Should the answer beat the
// cut (a 2xx), the head settles and the rest is handed over after it
// (parkAfterHead). l.mu held.
func (l *Lane) cutRequest(s *stream) {
	s.parkAfterHead = true
	s.cut = true
	if s.cancel != nil {
		s.cancel()
	}
}

// cutDone applies the outcome of a request cut by an isolation, reporting
// whether it did: the request ended without an answer, so nothing is
// charged or logged (as at shutdown), and the stream is parked with the
// head as its first row — the delivery is handed over, not settled by the
// cut. An answer that beat the cut, a revoke or shutdown under way, or a
// deleted subscription are left to done. l.mu held.
func (l *Lane) cutDone(s *stream, it *item, rt *route, res delivery.AttemptResult) bool {
	if !s.cut {
		return false
	}
	s.cut = false
	if !res.Interrupted {
		return false
	}
	if rt == nil || l.stopping || it.rec.part.revoked || len(s.fast) == 0 || s.fast[0] != it {
		// Nothing settles (done): the partition's next owner, or this
		// member after a restart, sends it again; the stream is not parked
		// by this member any more.
		s.parkAfterHead = false
		return false
	}
	l.stats.cut.Add(1)
	s.parkAfterHead = false
	l.parkHeld(s)
	return true
}
