package cli

func init() {
	registerStage(stageCommand{
		use:   "consume",
		short: "Row engine: turn Kafka records into webhook delivery rows (consumer group, each record once)",
		long: `consume is the row engine's fan-out, run with WEBHOOK_FAST_LANE=false (with the
fast lane, the default, ` + "`bridge deliver`" + ` reads the topics itself and consume
refuses to start, exit 2). It joins the Kafka consumer group CONSUMER_GROUP on CONSUMER_TOPICS and
turns each record into one delivery per matching enabled subscription. Each
polled batch is one PostgreSQL transaction that records the records' dedup ids
in the consumer inbox (a redelivered or duplicated record adds nothing); Kafka
offsets are committed only after it. Records that cannot be processed go to
"<topic>.dlq" with a dlq-reason header. SIGTERM finishes and commits the batch
in flight, then leaves the group.

Needs DATABASE_URL (migrated schema), KAFKA_BROKERS and CONSUMER_TOPICS.`,
		example: `  DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable WEBHOOK_FAST_LANE=false \
  KAFKA_BROKERS=127.0.0.1:9092 CONSUMER_TOPICS=assets,orders bridge consume

  # every topic starting with "assets.", in group "bridge-eu"
  WEBHOOK_FAST_LANE=false CONSUMER_TOPICS='~^assets\.' CONSUMER_GROUP=bridge-eu bridge consume`,
		service: serviceConsume,
		stages:  []stage{consumeStage},
	})
}
