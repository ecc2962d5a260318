// Package outboxstore owns the outbox — the log (bridge.outbox_log and its
// rotation), the held rows (bridge.outbox_held), the lanes' positions
// (bridge.relay_positions), the bridge.outbox view — and
// bridge.asset_counters: every statement over them lives here, next to the
// comment that says why it is written the way it is. The relay reads batches
// and writes outcomes and positions through it, operators (CLI, admin API,
// metrics) read and replay through it, and the demo and the relay benchmark
// fill, count and clear their own topics through it. Applications write the
// tables only through the SQL functions bridge.enqueue and
// bridge.enqueue_batch (package outbox).
//
// Every function takes a DB — a pool, a connection or a transaction — and
// leaves timeouts to the caller.
package outboxstore

import (
	"fmt"
	"time"

	"github.com/outboxbridge/bridge/internal/database/statement"
)

// DB is what the statements run on: *pgxpool.Pool, *pgx.Conn and pgx.Tx all
// satisfy it (the one interface every table owner takes).
type DB = statement.DB

// Interval renders d as a PostgreSQL interval literal (millisecond
// precision), for the `$n::interval` parameters.
func Interval(d time.Duration) string { return fmt.Sprintf("%d milliseconds", d.Milliseconds()) }
