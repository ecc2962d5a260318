package metrics

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/outboxbridge/bridge/internal/progress"
)

// ObserveStall exports bridge.stage.stalled{stage}: for how long the
// stage has made no progress while work waits for it (0 when it is
// progressing or idle), read at every scrape. The returned function
// unregisters it.
func (m *Metrics) ObserveStall(w *progress.Watch) (func() error, error) {
	g, err := m.meter.Float64ObservableGauge("bridge.stage.stalled",
		metric.WithDescription("Seconds the stage has made no progress while work waits for it (0: progressing or idle)."),
		metric.WithUnit("s"))
	if err != nil {
		return nil, fmt.Errorf("create stall instrument: %w", err)
	}
	stage := metric.WithAttributes(attribute.String("stage", w.Stage))
	reg, err := m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		d, _, err := w.Stalled(ctx)
		if err != nil {
			return nil // no value beats a wrong one
		}
		o.ObserveFloat64(g, d.Seconds(), stage)
		return nil
	}, g)
	if err != nil {
		return nil, fmt.Errorf("register stall instrument: %w", err)
	}
	return reg.Unregister, nil
}
