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
	opts, err := kafkaclient.Options(cfg.Kafka, logger)
	if err != nil {
		return nil, err
	}
	return &Source{Opts: opts, Topics: cfg.Consumer.Topics, Values: values}, nil
}
