package fastlane

import (
	"time"

	"github.com/outboxbridge/bridge/internal/delivery"
)

// What the lane keeps per subscription about its endpoint being slow: its
// requests in flight past overdueAfter (the live limit's side), and how
// often its deliveries are appended to the slow lane while it is isolated
// at its endpoint (the hand-over's side).

// endpointState is one subscription's.
type endpointState struct {
	// late: its requests in flight longer than overdueAfter; lateSent: when
	// the most recently sent of them was sent; quickSent: when the most
	// recently sent of its requests that ended before going late was sent.
	late                int
	lateSent, quickSent time.Time
	// pacedUntil: isolated at its endpoint (failing, or slow) until then,
	// its deliveries are appended behind its parked streams at most every
	// pacedHandOverEvery; handed: its last hand-over meanwhile (see
	// deferHandOver).
	pacedUntil, handed time.Time
}

// endpoint returns sub's state, creating it. l.mu held.
func (l *Lane) endpoint(sub string) *endpointState {
	if l.endpoints == nil {
		l.endpoints = map[string]*endpointState{}
	}
	e := l.endpoints[sub]
	if e == nil {
		e = &endpointState{}
		l.endpoints[sub] = e
	}
	return e
}

// sendsUncounted reports whether a request of sub starts outside the live
// limit: sub has a request in flight past overdueAfter and none of its
// requests sent after that one has ended before going late — its endpoint
// holds every request it gets, not one unlucky request among quick ones.
// Counted, each of its requests would hold one of the limit's places for
// overdueAfter before tickLimit let it go, and at a limit of 8 a
// subscription whose streams come up in the ready queue as often as the
// others' holds all 8 within milliseconds: the healthy subscriptions sent
// nothing for a tenth of a second at a time until the slow one reached its
// per-subscription cap, 0.4 s of a 3.6-s drain in `bench deliver
// --slow-subscriptions 1`. WEBHOOK_WORKERS and the per-subscription cap
// still bound its requests; its first quick answer puts its requests back
// under the limit. l.mu held.
func (l *Lane) sendsUncounted(sub string) bool {
	e := l.endpoints[sub]
	return l.lim.adaptive && e != nil && e.late > 0 && !e.quickSent.After(e.lateSent)
}

// wentLate notes that s's request has been in flight past overdueAfter.
// l.mu held.
func (l *Lane) wentLate(s *stream) {
	s.late = true
	e := l.endpoint(s.key.sub)
	e.late++
	if s.sentAt.After(e.lateSent) {
		e.lateSent = s.sentAt
	}
}

// requestEnded notes the end of s's request (sent at s.sentAt). A request
// that ended before going late, with an answer, tells that the endpoint
// answers; one cut, revoked or shut down tells nothing. l.mu held.
func (l *Lane) requestEnded(s *stream, res delivery.AttemptResult) {
	if s.late {
		s.late = false
		l.endpoint(s.key.sub).late--
		return
	}
	if res.Interrupted {
		return
	}
	if e := l.endpoints[s.key.sub]; e != nil && s.sentAt.After(e.quickSent) {
		e.quickSent = s.sentAt
	}
}

// pacedHandOverEvery: a subscription isolated at its endpoint has its
// deliveries appended behind its parked streams at most this often (see
// deferHandOver).
const pacedHandOverEvery = time.Second

// paceHandOvers appends sub's deliveries at most every pacedHandOverEvery
// until until (see deferHandOver). l.mu held.
func (l *Lane) paceHandOvers(sub string, until time.Time) {
	if e := l.endpoint(sub); until.After(e.pacedUntil) {
		e.pacedUntil = until
	}
}

// deferHandOver reports whether s's appends wait for a later hand-over: its
// subscription is isolated at its endpoint — it fails (headFailed) or it is
// slow (isolateSlow) — and had a hand-over less than pacedHandOverEvery
// ago. The slow lane then probes a failing endpoint (one request a second
// at most), or has a slow one at its cap with the isolation's backlog
// (each request seconds long), so what HandOverInterval buys a parked
// stream — its next delivery claimable soon — buys nothing, while each
// hand-over is a transaction and a claim its NOTIFY wakes in every claim
// loop: ten a second for such a subscription, which in `bench deliver
// --slow-subscriptions 1` made 80 claims a second of the live phase (7 in
// the clean run) beside the healthy subscriptions' requests. The
// deliveries wait in memory meanwhile, unsettled. l.mu held.
func (l *Lane) deferHandOver(s *stream, now time.Time) bool {
	e := l.endpoints[s.key.sub]
	return s.park == nil && e != nil && e.pacedUntil.After(now) && now.Sub(e.handed) < pacedHandOverEvery
}

// handedOver notes a hand-over of sub (see deferHandOver). l.mu held.
func (l *Lane) handedOver(sub string, now time.Time) {
	if e := l.endpoints[sub]; e != nil && e.pacedUntil.After(now) {
		e.handed = now
	}
}
