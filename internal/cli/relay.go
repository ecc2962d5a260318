package cli

func init() {
	registerStage(stageCommand{
		use:   "relay",
		short: "Relay committed outbox rows to Kafka, keyed by asset, in order",
		long: `Claims NEW rows of bridge.outbox in seq order and produces them to Kafka
(key = asset id, Java-compatible murmur2, idempotent, acks=all), marking them
SENT with partition and offset after the broker acknowledged them. Any number of
replicas may run: assets are spread over 64 leased lanes, so one asset is only
ever produced by one replica. SIGTERM drains in-flight acks and exits 0.`,
		example: `  DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable \
  KAFKA_BROKERS=127.0.0.1:9092 bridge relay`,
		service: serviceRelay,
		stages:  []stage{relayStage},
	})
}
