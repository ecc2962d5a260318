package outboxstore

import (
	"context"
	"fmt"
)

// tableWritesSQL sums PostgreSQL's cumulative row counters over the tables
// that hold the outbox's events (outboxTables), for the relay benchmark's
// per-event write counts. The counters are flushed by each backend at most
// once a second, so a reading right after a burst can lag it; see
// TableWrites.
const tableWritesSQL = `
SELECT coalesce(sum(n_tup_ins), 0)::bigint, coalesce(sum(n_tup_upd), 0)::bigint,
       coalesce(sum(n_tup_del), 0)::bigint, coalesce(sum(n_dead_tup), 0)::bigint,
       coalesce(sum(autovacuum_count + vacuum_count), 0)::bigint
FROM pg_stat_user_tables
WHERE schemaname = 'bridge' AND relname = ANY($1::text[])`

// outboxTables are the tables whose row writes count as the outbox's: the
// log's four tables and the held rows.
var outboxTables = []string{"outbox_log_0", "outbox_log_1", "outbox_log_2", "outbox_log_3", "outbox_held"}

// Writes are the outbox tables' cumulative row counters (pg_stat_user_tables).
type Writes struct {
	Inserts, Updates, Deletes int64
	// Dead is n_dead_tup now (not cumulative); Vacuums counts vacuum and
	// autovacuum runs.
	Dead, Vacuums int64
}

// Sub returns the counters' growth since before (Dead stays w's).
func (w Writes) Sub(before Writes) Writes {
	return Writes{Inserts: w.Inserts - before.Inserts, Updates: w.Updates - before.Updates,
		Deletes: w.Deletes - before.Deletes, Dead: w.Dead, Vacuums: w.Vacuums - before.Vacuums}
}

// TableWrites reads the outbox tables' row counters.
func TableWrites(ctx context.Context, db DB) (Writes, error) {
	var w Writes
	if err := db.QueryRow(ctx, tableWritesSQL, outboxTables).Scan(&w.Inserts, &w.Updates, &w.Deletes, &w.Dead, &w.Vacuums); err != nil {
		return w, fmt.Errorf("read the outbox tables' row counters: %w", err)
	}
	return w, nil
}
