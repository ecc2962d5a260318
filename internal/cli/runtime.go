package cli

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/relay"
)

// runtime is what every long-running command shares: logger, database pool,
// tracing and metrics. The observability wiring (OTEL_* setup, /metrics,
// /healthz, /readyz) plugs in here.
type runtime struct {
	Logger         *slog.Logger
	Pool           *pgxpool.Pool
	TracerProvider trace.TracerProvider
	RelayMetrics   relay.Metrics
	closers        []func()
}

func startRuntime(ctx context.Context, cfg *config.Config, service string) (*runtime, error) {
	logger := newLogger(cfg).With("service", service)
	pool, err := openCurrentDB(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rt := &runtime{Logger: logger, Pool: pool, TracerProvider: otel.GetTracerProvider()}
	rt.closers = append(rt.closers, pool.Close)
	return rt, nil
}

// Close releases everything in reverse order.
func (rt *runtime) Close() {
	for i := len(rt.closers) - 1; i >= 0; i-- {
		rt.closers[i]()
	}
}
