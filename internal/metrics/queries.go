package metrics

// The delivery gauges' SQL, one named constant each. The outbox gauges use
// outboxstore.ReadStats and the consumer lag consumer.Lag, so each of those queries
// stays in one place too.

// deliveriesByStatusSQL counts deliveries by status. It reads the whole
// table (delivered rows included), which is why it runs at most once per
// refresh interval rather than per scrape.
const deliveriesByStatusSQL = `
SELECT status, count(*) FROM bridge.deliveries GROUP BY status`

// subscriptionsByStateSQL counts enabled and disabled subscriptions.
const subscriptionsByStateSQL = `
SELECT count(*) FILTER (WHERE enabled), count(*) FILTER (WHERE NOT enabled) FROM bridge.subscriptions`

// oldestOpenDeliverySQL returns, per subscription, the age in seconds of its
// oldest delivery not yet delivered or dead (pending or delivering; NULL when
// none): how far that endpoint's webhooks are behind. One index probe per
// (subscription, status) on deliveries_by_subscription_status (ids are
// handed out in insert order), so the cost follows the number of
// subscriptions, not the backlog.
const oldestOpenDeliverySQL = `
SELECT s.id::text, extract(epoch FROM now() - least(p.created_at, d.created_at))::float8
FROM bridge.subscriptions s
LEFT JOIN LATERAL (
  SELECT x.created_at FROM bridge.deliveries x
  WHERE x.subscription_id = s.id AND x.status = 'pending' ORDER BY x.id LIMIT 1
) p ON true
LEFT JOIN LATERAL (
  SELECT x.created_at FROM bridge.deliveries x
  WHERE x.subscription_id = s.id AND x.status = 'delivering' ORDER BY x.id LIMIT 1
) d ON true
WHERE s.enabled OR p.created_at IS NOT NULL OR d.created_at IS NOT NULL`
