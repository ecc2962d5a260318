package cli

func init() {
	registerStage(stageCommand{
		use:   "deliver",
		short: "Send webhooks from the event topics (the fast lane) and retry failing streams from PostgreSQL",
		long: `deliver joins the Kafka consumer group CONSUMER_GROUP on CONSUMER_TOPICS (the
fast lane, WEBHOOK_FAST_LANE, the default) and, for each record of the
partitions it owns, POSTs one webhook per matching enabled subscription with
Standard Webhooks signatures and the event's traceparent — at most one in
flight per (subscription, asset), in order. A stream whose head fails is
parked in bridge.deliveries (the slow lane): retried on WEBHOOK_RETRY_SCHEDULE
(±20% jitter), then dead, and the ones behind it proceed; WEBHOOK_DISABLE_AFTER
consecutive deaths (or one 410 Gone) disable the subscription. The stream
comes back to the fast lane once the slow lane has emptied it. Offsets are
committed up to what every subscription has settled. Run up to one replica
per partition.

With WEBHOOK_FAST_LANE=false (the row engine) it posts only the rows
` + "`bridge consume`" + ` writes, claiming them from PostgreSQL; run as many replicas as you
like.

SIGTERM stops taking new work, lets requests in flight finish for
WEBHOOK_SHUTDOWN_GRACE, and gives back the rest without charging an attempt
(the partition's next owner sends them again with the same webhook-id). A
second signal exits at once; claims left behind return after WEBHOOK_LEASE.

Needs DATABASE_URL (migrated schema), KAFKA_BROKERS and CONSUMER_TOPICS
(DATABASE_URL only with WEBHOOK_FAST_LANE=false). Private, loopback and
link-local destinations are refused unless listed in WEBHOOK_ALLOWED_CIDRS.`,
		example: `  DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable \
  KAFKA_BROKERS=127.0.0.1:9092 CONSUMER_TOPICS=assets bridge deliver

  # local demo receiver on this machine
  WEBHOOK_ALLOWED_CIDRS=127.0.0.0/8 WEBHOOK_ALLOW_HTTP=true WEBHOOK_WORKERS=64 CONSUMER_TOPICS=assets bridge deliver

  # the row engine: rows written by bridge consume
  WEBHOOK_FAST_LANE=false bridge deliver`,
		service: serviceDeliver,
		stages:  []stage{deliverStage},
	})
}
