package cli

func init() {
	registerStage(stageCommand{
		use:   "deliver",
		short: "Send webhook deliveries: per-(subscription, asset) order, retries, dead letters, auto-disable",
		long: `deliver claims pending deliveries from PostgreSQL — at most one in flight per
(subscription, asset), in seq order — and POSTs them with Standard Webhooks
signatures and the event's traceparent. Failures are retried on
WEBHOOK_RETRY_SCHEDULE (±20% jitter), then the delivery is dead and the ones
behind it proceed; WEBHOOK_DISABLE_AFTER consecutive deaths (or one 410 Gone)
disable the subscription. Run as many replicas as you like.

SIGTERM stops claiming, lets requests in flight finish for a few seconds, and
gives back the rest without charging an attempt. A second signal exits at once;
claims left behind return after WEBHOOK_LEASE.

Needs DATABASE_URL (migrated schema). Private, loopback and link-local
destinations are refused unless listed in WEBHOOK_ALLOWED_CIDRS.`,
		example: `  DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable bridge deliver

  # local demo receiver on this machine
  WEBHOOK_ALLOWED_CIDRS=127.0.0.0/8 WEBHOOK_ALLOW_HTTP=true WEBHOOK_WORKERS=64 bridge deliver`,
		service: serviceDeliver,
		stages:  []stage{deliverStage},
	})
}
