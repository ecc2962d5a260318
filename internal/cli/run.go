package cli

func init() {
	registerStage(stageCommand{
		use:   "run",
		short: "Run relay and deliver (and, on the row engine, consume) in one process",
		long: `run is relay + deliver in one process (relay + consume + deliver with
WEBHOOK_FAST_LANE=false, the row engine), sharing one database pool, one
tracer provider and one ops server (HTTP_ADDR). Each part keeps its own
guarantees and its own graceful shutdown: SIGTERM drains them all. If one part
fails, the others are stopped and run exits 1.

Needs DATABASE_URL (migrated schema), KAFKA_BROKERS and CONSUMER_TOPICS.`,
		example: `  DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable \
  KAFKA_BROKERS=127.0.0.1:9092 CONSUMER_TOPICS=assets bridge run`,
		service: serviceAll,
		stages:  allStages,
	})
}
