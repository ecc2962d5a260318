package delivery

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/tracing"
)

// process sends one claimed delivery. A success or a retry goes to the
// recorder, which writes it with others (it reports true: the claim stays out
// until then); a death or a release is written here.
func (d *Deliverer) process(ctx, reqCtx context.Context, c store.Claim, results outcomeQueues) bool {
	logCtx := tracing.ContextWithRemoteParent(context.WithoutCancel(ctx), c.Traceparent, c.Tracestate)
	bctx, cancel := context.WithTimeout(logCtx, queryTimeout)
	defer cancel()

	if ctx.Err() != nil {
		// Claimed, but shutdown began before a worker took it: not sent, so
		// not charged.
		d.release(bctx, d.claimLog(&c), &c)
		return false
	}
	res := d.sendLending(reqCtx, &c)
	if !res.success() && res.status == 0 && reqCtx.Err() != nil {
		// Cancelled by shutdown after the grace period: the endpoint did not
		// fail, the deploy interrupted it.
		d.release(bctx, d.claimLog(&c), &c)
		return false
	}
	out := store.Outcome{
		StartedAt: res.started, Duration: res.duration, StatusCode: res.status, Error: res.describe(),
		ResponseBody: truncateUTF8(res.body, maxResponseStored), TraceID: res.traceID,
	}
	if res.success() {
		if d.breakers.succeeded(c.SubscriptionID, time.Now()) {
			d.poke() // the heads that waited behind the probe are claimable
		}
		d.cfg.Metrics.Attempt(res.status, res.duration, store.StatusDelivered)
		results.delivered <- recorded{res: store.Result{Claim: &c, Kind: store.Delivered, Outcome: out}, ctx: logCtx, status: res.status}
		return true
	}
	d.breakers.failed(&c, time.Now())
	log := d.claimLog(&c)
	gone := res.status == http.StatusGone
	if gone || c.Attempts >= d.cfg.maxAttempts() {
		d.cfg.Metrics.Attempt(res.status, res.duration, store.StatusDead)
		r, err := d.store.Dead(bctx, &c, d.cfg.ID, out, d.cfg.DisableAfter, gone)
		switch {
		case err != nil:
			log.ErrorContext(bctx, "recording a dead delivery failed", "err", err, "error", out.Error)
		case !r.Current:
			log.WarnContext(bctx, "failed after the claim was reclaimed; outcome logged only", "error", out.Error)
		default:
			log.ErrorContext(bctx, "delivery dead; the rows behind it in its stream proceed", "error", out.Error, "status", res.status,
				"consecutive_dead", r.ConsecutiveFailures)
			d.deadSpan(bctx, &c, out.Error)
			if r.DisabledNow {
				d.cfg.Metrics.SubscriptionDisabled()
				log.ErrorContext(bctx, "subscription disabled", "reason", r.DisabledReason)
			}
		}
		return false
	}
	d.cfg.Metrics.Attempt(res.status, res.duration, "retry")
	scheduled := d.cfg.RetrySchedule[c.Attempts-1]
	delay := retryDelay(scheduled, jitter(scheduled), res.retryAfter, res.hasRA)
	results.retries <- recorded{res: store.Result{Claim: &c, Kind: store.Retry, Outcome: out, RetryIn: delay}, ctx: logCtx, status: res.status}
	return true
}

// slowRequest is how long a request runs before it lends its claim slot
// back (sendLending).
const slowRequest = 250 * time.Millisecond

// sendLending sends c; while the request runs longer than slowRequest its
// claim slot is lent back to the claim loops. Without it an endpoint taking
// 5 s per answer held its subscription's whole cap of slots out of the
// deliverer's capacity for the whole time, and the other subscriptions —
// whose claims are bounded by that capacity — lost as much throughput (42%
// with 8 of 64 slots held on a busy machine). The subscription itself gains
// nothing from it: its cap counts its deliveries in flight in the database,
// not these slots. What bounds the deliverer is then the workers: a lent
// slot's request still runs on one, so at most Workers slots are lent, and
// the jobs queue has room for them.
func (d *Deliverer) sendLending(ctx context.Context, c *store.Claim) result {
	var lent atomic.Bool
	t := time.AfterFunc(slowRequest, func() {
		if lent.CompareAndSwap(false, true) {
			d.inFlight.Add(-1)
			d.poke()
		}
	})
	res := send(ctx, d.client, c, d.cfg.Timeout, time.Now())
	t.Stop()
	if !lent.CompareAndSwap(false, true) {
		// It was lent: take the slot back, so that writing the outcome
		// gives back exactly one.
		d.inFlight.Add(1)
	}
	return res
}

// deadSpan records a dead delivery in its trace: a short span with a
// delivery.dead event, so the trace in Jaeger shows where the event stopped.
func (d *Deliverer) deadSpan(ctx context.Context, c *store.Claim, reason string) {
	_, span := d.tracer.Start(ctx, "webhook dead", trace.WithAttributes(
		attribute.String("messaging.message.id", c.EventID),
		attribute.String("webhook.subscription_id", c.SubscriptionID),
		attribute.Int64("webhook.delivery_id", c.ID),
		attribute.Int("webhook.attempt", c.Attempts)))
	span.AddEvent("delivery.dead", trace.WithAttributes(attribute.String("reason", reason)))
	span.SetStatus(codes.Error, reason)
	span.End()
}

// claimLog is the logger of one delivery's lines. It is built only for a
// line that is written: built for every delivery, its five attributes and
// the URL's redaction were ~2% of the bridge's CPU in bench pipeline, for a
// success line that is Debug and off by default.
func (d *Deliverer) claimLog(c *store.Claim) *slog.Logger {
	return d.log.With("delivery_id", c.ID, "dedup_id", c.EventID, "subscription_id", c.SubscriptionID,
		"attempt", c.Attempts, "url", redactURL(c.URL))
}

func (d *Deliverer) release(ctx context.Context, log *slog.Logger, c *store.Claim) {
	if err := d.store.Release(ctx, c, d.cfg.ID); err != nil {
		log.ErrorContext(ctx, "release failed; the lease will return it", "err", err)
	}
}

// redactURL keeps scheme, host and path: subscribers put tokens in query
// strings and userinfo, and logs and traces travel further than the
// database. Everything that shows a subscription's URL outside the
// subscriptions table (log lines, span attributes, an attempt's error)
// goes through it.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL)"
	}
	u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment, u.User, u.Opaque = "", false, "", "", nil, ""
	return u.String()
}
