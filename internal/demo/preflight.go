package demo

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/outboxstore"
)

// ErrNotScratch is wrapped by Preflight's refusals.
var ErrNotScratch = errors.New("the demo's relay would take events that are not its own")

// Preflight refuses to start the demo where its relay would take events that
// are not its own. The relay claims every NEW row of the database, whatever
// the topic, and the demo points it at a broker of its own:
//
//   - rows of other topics waiting to be relayed would be sent to the demo's
//     broker (with the embedded one, into a broker that vanishes at exit) and
//     marked SENT — lost to their real consumers;
//   - with the embedded broker, a relay replica already running against this
//     database would hold some lanes, and the demo's events on those lanes
//     would go to that replica's broker instead of the demo's.
//
// Rows of earlier demo runs (topics demo.assets.*) are fine to relay.
func Preflight(ctx context.Context, pool *pgxpool.Pool, embedded bool) error {
	qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	n, topic, err := outboxstore.ForeignNewRows(qctx, pool, "demo.assets.")
	if err != nil {
		return fmt.Errorf("demo preflight: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("%w: %d NEW outbox rows of other topics (e.g. %q) wait there, and the demo's relay would send them to its own broker", ErrNotScratch, n, topic)
	}
	if !embedded {
		return nil
	}
	rows, err := pool.Query(qctx, liveRelaysSQL)
	if err != nil {
		return fmt.Errorf("demo preflight: %w", err)
	}
	type member struct {
		id, host string
		left     int
	}
	live, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (member, error) {
		var m member
		err := r.Scan(&m.id, &m.host, &m.left)
		return m, err
	})
	if err != nil {
		return fmt.Errorf("demo preflight: %w", err)
	}
	if len(live) > 0 {
		desc := make([]string, len(live))
		longest := 0
		for i, m := range live {
			desc[i] = fmt.Sprintf("%s on %q", m.id, m.host)
			longest = max(longest, m.left)
		}
		return fmt.Errorf("%w: %d relay replica(s) run against it (%s) and would take part of the demo's events to their broker (stop them, or set KAFKA_BROKERS to theirs; a crashed one's lease expires in %ds)",
			ErrNotScratch, len(live), strings.Join(desc, ", "), longest)
	}
	return nil
}
