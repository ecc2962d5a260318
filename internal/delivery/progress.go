package delivery

import (
	"context"
	"fmt"
)

// Progress grows with every claim statement that served subscriptions (or
// found another replica serving them) and every batch of outcomes written: with Waiting it tells a deliverer that is stuck from
// one with nothing to do (internal/progress, /readyz).
func (d *Deliverer) Progress() int64 { return d.stats.progress.Load() }

// dueWaiting: is a delivery of an enabled subscription due? Only such a
// delivery waits for a deliverer (a disabled subscription's wait for it to
// be enabled; a retry's for its time). Bounded, so the answer costs the
// same whatever the backlog.
const dueWaiting = `
SELECT count(*) FROM (
  SELECT 1 FROM bridge.deliveries d JOIN bridge.subscriptions s ON s.id = d.subscription_id
  WHERE d.status = 'pending' AND d.next_attempt_at <= now() AND s.enabled
  LIMIT 1000) w`

// Waiting says whether deliveries are due ("" when none is).
func (d *Deliverer) Waiting(ctx context.Context) (string, error) {
	var n int
	if err := d.pool.QueryRow(ctx, dueWaiting).Scan(&n); err != nil {
		return "", fmt.Errorf("count due deliveries: %w", err)
	}
	switch {
	case n == 0:
		return "", nil
	case n >= 1000:
		return "1000 or more deliveries are due", nil
	}
	return fmt.Sprintf("%d deliveries are due", n), nil
}
