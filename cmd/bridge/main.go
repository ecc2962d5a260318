// Command bridge carries domain events from a PostgreSQL outbox to Kafka and
// from Kafka to subscribers' webhooks. See README.md.
package main

import (
	"os"

	"github.com/outboxbridge/bridge/internal/cli"
)

func main() {
	os.Exit(cli.Execute(os.Args[1:], os.Stdout, os.Stderr))
}
