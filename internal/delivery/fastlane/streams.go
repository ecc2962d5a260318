package fastlane

import (
	"context"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// Streams: one (subscription, asset) stream per key, one request in flight
// each, its items in partition order; the workers that post their heads and
// what happens to a stream when its head settles or fails.

type streamKey struct{ sub, asset string }

// record is a polled record and how many of its deliveries are not yet
// settled (posted with a 2xx, or written to bridge.deliveries).
type record struct {
	part    *partition
	rec     *kgo.Record
	msg     contract.Message
	pending int
	bytes   int64
	polled  time.Time
	// items are its deliveries: isolation looks at who still holds a
	// partition's oldest record.
	items []*item
}

type item struct {
	rec     *record
	sub     string
	settled bool
}

// stream is one (subscription, asset) stream's state. Either it is in the
// fast lane (fast holds its deliveries, fast[0] in flight while sending), or
// parked (its deliveries go to toPG and from there, by the hand-over
// service, behind its rows in bridge.deliveries).
type stream struct {
	key     streamKey
	fast    []*item
	sending bool
	sentAt  time.Time // when the head in flight was sent
	// overdue: the head in flight does not count against the live limit
	// (see tickLimit, sendsUncounted).
	overdue bool
	queued  bool // in ready or in its subscription's waiting list
	parked  bool

	// late: the head has been in flight past overdueAfter (see wentLate).
	late bool
	// handing: a hand-over of this stream is being written; toPG collects
	// what arrives meanwhile.
	handing bool
	inHandQ bool
	toPG    []*item
	// parkAfterHead: the stream's subscription was isolated while its head
	// was in flight; once the head settles, the rest is handed over.
	parkAfterHead bool
	// cancel cuts the head's request in flight (nil: none in flight); cut:
	// an isolation cut it, so the head goes to the slow lane too (see
	// cutRequest).
	cancel context.CancelFunc
	cut    bool
	// lastHand is handGen when its last hand-over finished.
	lastHand uint64
	// park, when set, is the park the next hand-over writes: the marker, and
	// the failed attempt of toPG[0] (nil failure: parked without one, e.g. a
	// rate-limited subscription).
	park *parkInfo
}

type parkInfo struct {
	failure *delivery.AttemptResult
	retryIn time.Duration
}

// stream returns the stream of key, creating it (parked if a marker says
// so). l.mu held.
func (l *Lane) stream(key streamKey) *stream {
	s := l.streams[key]
	if s == nil {
		s = &stream{key: key, parked: l.parkedKeys[key]}
		l.streams[key] = s
	}
	return s
}

// toSlowLane queues it for the hand-over service. l.mu held.
func (l *Lane) toSlowLane(s *stream, it *item) {
	s.toPG = append(s.toPG, it)
	if !s.handing && !s.inHandQ {
		s.inHandQ = true
		l.handQ = append(l.handQ, s)
		l.hand.Signal()
	}
}

// schedule makes s's head ready to send if nothing of s is in flight and its
// subscription is under its cap. l.mu held.
func (l *Lane) schedule(s *stream) {
	if s.sending || s.queued || s.parked || len(s.fast) == 0 {
		return
	}
	sub := l.subs[s.key.sub]
	if sub == nil {
		sub = &subState{}
		l.subs[s.key.sub] = sub
	}
	s.queued = true
	if sub.inFlight >= l.capOf(s.key.sub) {
		sub.waiting = append(sub.waiting, s)
		return
	}
	sub.inFlight++
	l.ready = append(l.ready, s)
	l.work.Signal()
}

// settle counts one delivery of rec as settled. l.mu held.
func (l *Lane) settle(rec *record) {
	rec.pending--
}

// settleItem counts it as settled. l.mu held.
func (l *Lane) settleItem(it *item) {
	if !it.settled {
		it.settled = true
		it.rec.pending--
		l.unwait(it)
	}
}

// forget drops s if it holds nothing. l.mu held.
func (l *Lane) forget(s *stream) {
	if !s.parked && !s.sending && !s.queued && !s.handing && len(s.fast) == 0 && len(s.toPG) == 0 {
		delete(l.streams, s.key)
	}
}

// worker sends stream heads until the lane stops.
func (l *Lane) worker(reqCtx context.Context) {
	// Each request's context (its cut, see cutRequest) derives from a
	// context of this worker's own, not from reqCtx directly: every child
	// of a context is added to and removed from its parent's set under the
	// parent's lock, and with reqCtx as the parent all the workers took
	// that one lock twice per request. A cancelled reqCtx still reaches
	// every request through the worker's context.
	wctx, wcancel := context.WithCancel(reqCtx)
	defer wcancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		// A worker sends while fewer than the live limit's requests are
		// counted in flight (see limiter.go); the others wait.
		for (len(l.ready) == 0 || l.active >= l.lim.limit) && !l.stopping {
			l.work.Wait()
		}
		if l.stopping {
			return
		}
		s := l.ready[0]
		l.ready[0] = nil
		l.ready = l.ready[1:]
		s.queued = false
		if len(s.fast) == 0 || s.parked || s.fast[0].rec.part.revoked {
			l.release(s)
			l.forget(s)
			continue
		}
		s.sending = true
		s.sentAt = time.Now()
		s.overdue = l.sendsUncounted(s.key.sub)
		if !s.overdue {
			l.active++
		}
		l.sending[s] = struct{}{}
		it := s.fast[0]
		rt := l.route(it.sub)
		ctx, cancel := context.WithCancel(wctx)
		s.cancel = cancel
		l.mu.Unlock()
		var res delivery.AttemptResult
		if rt == nil {
			res = delivery.AttemptResult{Outcome: store.Outcome{StartedAt: time.Now(), Error: "subscription deleted"}}
		} else {
			res = delivery.Attempt(ctx, l.http, claimOf(it, rt), l.cfg.Timeout)
		}
		cancel()
		l.mu.Lock()
		s.cancel = nil
		s.sending = false
		if s.overdue {
			s.overdue = false
		} else {
			l.active--
		}
		l.requestEnded(s, res)
		if res.Success && rt != nil && !s.cut {
			l.sampleLimit(it.sub, res.Outcome.Duration)
		}
		delete(l.sending, s)
		l.release(s)
		l.done(s, it, rt, res)
		if l.idleWaiters > 0 {
			l.idle.Broadcast()
		}
	}
}

// release gives s's subscription slot back and starts a stream waiting for
// it. l.mu held.
func (l *Lane) release(s *stream) {
	sub := l.subs[s.key.sub]
	sub.inFlight--
	l.admit(sub, l.capOf(s.key.sub))
}

// admit starts sub's streams waiting for a slot while it has fewer than
// limit requests in flight. l.mu held.
func (l *Lane) admit(sub *subState, limit int) {
	for len(sub.waiting) > 0 && sub.inFlight < limit {
		w := sub.waiting[0]
		sub.waiting[0] = nil
		sub.waiting = sub.waiting[1:]
		sub.inFlight++
		l.ready = append(l.ready, w)
		l.work.Signal()
	}
}

// done applies the outcome of s's head. l.mu held.
func (l *Lane) done(s *stream, it *item, rt *route, res delivery.AttemptResult) {
	if l.cutDone(s, it, rt, res) {
		return
	}
	if res.Interrupted || rt == nil {
		// Shutdown or a revoke cut the request (or the subscription is gone):
		// nothing settles; the record's next owner sends it again with the
		// same webhook-id. A deleted subscription's deliveries settle.
		if rt == nil {
			s.fast = s.fast[1:]
			l.settleItem(it)
		}
		l.schedule(s)
		l.forget(s)
		return
	}
	l.logAttempt(it, res)
	if sub := l.subs[it.sub]; sub != nil {
		sub.took = movingAverage(sub.took, res.Outcome.Duration, 16)
		sub.n++
	}
	if it.rec.part.revoked {
		// The partition moved while the request ran: its new owner sends
		// the record again (same webhook-id) unless this success was
		// committed before the revoke finished.
		if res.Success {
			l.settleItem(it)
		}
		s.fast = s.fast[1:]
		l.schedule(s)
		l.forget(s)
		return
	}
	if res.Success {
		l.cfg.Metrics.Attempt(res.Outcome.StatusCode, res.Outcome.Duration, store.StatusDelivered)
		l.stats.delivered.Add(1)
		l.forgive[it.sub] = true
		l.headSucceeded(it.sub)
		s.fast[0] = nil
		s.fast = s.fast[1:]
		l.settleItem(it)
		if s.parkAfterHead {
			s.parkAfterHead = false
			l.parkRest(s)
		}
		l.schedule(s)
		l.forget(s)
		return
	}
	l.stats.failed.Add(1)
	l.cfg.Metrics.Attempt(res.Outcome.StatusCode, res.Outcome.Duration, "retry")
	// The head failed: the stream is parked, this delivery and every later
	// one of the stream go to the slow lane, which retries on the schedule.
	s.parkAfterHead = false
	r := res
	s.parked = true
	s.park = &parkInfo{failure: &r, retryIn: delivery.RetryIn(l.cfg.RetrySchedule, 1, res)}
	rest := s.fast
	s.fast = nil
	for _, x := range rest {
		l.toSlowLane(s, x)
	}
	l.headFailed(s, time.Now())
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("stream parked: its head failed", "subscription_id", it.sub, "asset", s.key.asset,
			"dedup_id", it.rec.msg.DedupID, "error", res.Outcome.Error, "queued", len(rest))
	}
}

// parkRest hands every delivery s holds in the fast lane (none in flight)
// to the slow lane, without an attempt. l.mu held.
func (l *Lane) parkRest(s *stream) {
	if len(s.fast) == 0 || s.sending {
		return
	}
	l.parkHeld(s)
}

// parkHeld parks s and hands every delivery it holds in the fast lane to
// the slow lane, in order, without an attempt. l.mu held.
func (l *Lane) parkHeld(s *stream) {
	s.parked = true
	s.park = &parkInfo{}
	rest := s.fast
	s.fast = nil
	for _, x := range rest {
		l.toSlowLane(s, x)
	}
}

// claimOf is the slow lane's claim shape of an in-memory delivery, so both
// lanes send through the same code (signature, SSRF, trace, envelope).
func claimOf(it *item, rt *route) *store.Claim {
	m := &it.rec.msg
	return &store.Claim{
		SubscriptionID: it.sub, EventID: m.DedupID, EventType: m.EventType, Topic: it.rec.rec.Topic,
		AssetID: m.AssetID, AssetSeq: m.AssetSeq, Payload: m.Payload, EventCreatedAt: m.CreatedAt,
		Traceparent: m.Traceparent, Tracestate: m.Tracestate, Attempts: 1,
		URL: rt.URL, Secrets: rt.Secrets, SecretsErr: rt.SecretsErr, PayloadBytes: len(m.Payload),
	}
}
