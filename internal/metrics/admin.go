package metrics

import (
	"context"

	"go.opentelemetry.io/otel/metric"
)

type adminInstruments struct {
	authFailures metric.Int64Counter
}

func (a *adminInstruments) init(m metric.Meter) error {
	var err error
	a.authFailures, err = m.Int64Counter("bridge.admin.auth_failures",
		metric.WithDescription("Admin API requests rejected for a missing or wrong bearer token."),
		metric.WithUnit("{request}"))
	if err != nil {
		return err
	}
	// Exported from the start: an alert on increase() must see the first
	// rejection after a restart, which it cannot if the series only
	// appears with it.
	a.authFailures.Add(context.Background(), 0)
	return nil
}

// Admin records what the admin API rejects (adminapi.AuthMetrics).
type Admin struct{ m *Metrics }

// Admin returns the admin API hook recording into m.
func (m *Metrics) Admin() Admin { return Admin{m: m} }

// AuthFailure records one request rejected for its bearer token.
func (a Admin) AuthFailure() { a.m.admin.authFailures.Add(context.Background(), 1) }
