package outboxstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The planner's statistics on bridge.outbox. The claim's plan depends on them:
// when they say the table is (nearly) empty — it was analyzed while idle and
// a burst landed since, or it was never analyzed — the planner believes the
// NEW index holds a few hundred rows, reads all of them with a bitmap scan and
// sorts them instead of walking the index in seq order and stopping at the
// batch limit: ~200 ms per claim at 100,000 NEW rows instead of ~14 ms (the
// marks slow down too), growing with the backlog. Autovacuum fixes the
// statistics, but only at its next round (autovacuum_naptime, a minute by
// default): a minute of a relay at a fraction of its speed, seconds of lag
// at 5,000 events/s.

// outboxStatsSQL says whether the statistics describe the table: never
// analyzed (reltuples -1), less than a quarter of the table's pages known to
// them (it grew since: a burst; marking every row SENT only doubles it, so
// a drain alone does not count), or more rows changed since the last analyze
// than the statistics describe (the cumulative counters lag a second or so,
// which is why the page count is checked too). can_analyze: ANALYZE is only
// done by the table's owner, a superuser or the database's owner; anyone else
// gets a warning and nothing happens.
const outboxStatsSQL = `
SELECT c.reltuples::bigint,
       c.reltuples < 0
         OR pg_relation_size(c.oid) / current_setting('block_size')::bigint > 4 * c.relpages::bigint + 128
         OR coalesce(s.n_mod_since_analyze, 0) > greatest(c.reltuples::bigint, 0) + 10000 AS stale,
       pg_has_role(c.relowner, 'MEMBER')
         OR pg_has_role((SELECT datdba FROM pg_database WHERE datname = current_database()), 'MEMBER')
         OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS can_analyze
FROM pg_class c
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = 'bridge.outbox'::regclass`

// OutboxStats is what outboxStatsSQL found.
type OutboxStats struct {
	// Rows is the row count the statistics describe (-1: never analyzed).
	Rows       int64
	Stale      bool
	CanAnalyze bool
}

// ReadOutboxStats says whether bridge.outbox's planner statistics still
// describe it (a catalog lookup, no scan).
func ReadOutboxStats(ctx context.Context, db DB) (OutboxStats, error) {
	var s OutboxStats
	if err := db.QueryRow(ctx, outboxStatsSQL).Scan(&s.Rows, &s.Stale, &s.CanAnalyze); err != nil {
		return s, fmt.Errorf("read bridge.outbox statistics: %w", err)
	}
	return s, nil
}

// analyzeLockSQL serialises the relays' ANALYZEs of bridge.outbox: the key
// is in the relays' advisory-lock class (x'6F41', migration 00160 uses
// 1–3). Replicas whose claims meet the same backlog find the same stale
// statistics within milliseconds of each other; without the lock each
// would ANALYZE: three ANALYZEs of the same table in one drain, each a
// 30,000-row sample and a replan of every session's cached claim, make
// three replicas drain slower than one relay alone.
const analyzeLockSQL = `SELECT pg_advisory_xact_lock(x'6F410000'::int, 4)`

// AnalyzeOutboxIfStale refreshes bridge.outbox's planner statistics (a
// sample of 30,000 rows by default, whatever the table's size; plans cached
// by any session are replanned afterwards) unless another session refreshed
// them meanwhile: it waits for any ANALYZE another relay is running, reads
// the statistics again and analyzes only if they are still stale. It says
// whether it analyzed.
func AnalyzeOutboxIfStale(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}) (analyzed bool, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, analyzeLockSQL); err != nil {
			return fmt.Errorf("wait for another relay's analyze of bridge.outbox: %w", err)
		}
		st, err := ReadOutboxStats(ctx, tx)
		if err != nil || !st.Stale {
			return err
		}
		if _, err := tx.Exec(ctx, `ANALYZE bridge.outbox`); err != nil {
			return fmt.Errorf("analyze bridge.outbox: %w", err)
		}
		analyzed = true
		return nil
	})
	return analyzed, err
}
