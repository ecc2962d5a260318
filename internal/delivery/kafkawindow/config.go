package kafkawindow

import (
	"log/slog"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
)

// SourceFromConfig is the Source of an installation whose deliverer runs
// the fast lane (WEBHOOK_FAST_LANE=true), nil when it does not: then every
// delivery is a row and recover reads bridge.deliveries only. values may be
// nil (JSON values).
func SourceFromConfig(cfg *config.Config, values contract.ValueDecoder, logger *slog.Logger) (*Source, error) {
	if !cfg.Webhook.FastLane {
		return nil, nil
	}
	// The fast lane is the default: a process configured for the row
	// engine's recover (PostgreSQL only) learns what it now needs.
	if err := cfg.RequireEventTopics("to recover a window with WEBHOOK_FAST_LANE (the default): delivered events have no rows, so the window is read from the event topics; set it as for `bridge deliver`"); err != nil {
		return nil, err
	}
	opts, err := kafkaclient.Options(cfg.Kafka, logger)
	if err != nil {
		return nil, err
	}
	return &Source{Opts: opts, Topics: cfg.Consumer.Topics, Values: values}, nil
}
