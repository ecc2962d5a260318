package outboxstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Wake-ups only for relays that wait for them (migration 00160): every
// notifying commit queues behind the one before it for the database's
// notify-queue lock, through its WAL flush. A relay says whether
// it is busy (claiming again at once) or waiting with session advisory
// locks on its own connection, so a lost connection says neither, and
// writers then notify as if no relay were there.

// RelayBusy declares the relay on conn busy: commits stop notifying while
// no relay waits. For a connection that holds neither state.
func RelayBusy(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, `SELECT bridge.relay_busy()`); err != nil {
		return fmt.Errorf("declare the relay busy: %w", err)
	}
	return nil
}

// RelayBusyAgain declares the waiting relay on conn busy again.
func RelayBusyAgain(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, `SELECT bridge.relay_busy_again()`); err != nil {
		return fmt.Errorf("declare the relay busy again: %w", err)
	}
	return nil
}

// RelayWaiting declares the relay on conn waiting (wasBusy: it held BUSY;
// otherwise nothing), then waits up to gate for every commit that skipped
// its notification meanwhile to be visible: a claim after it sees every row
// no notification will announce. It returns false when that wait timed out.
func RelayWaiting(ctx context.Context, conn *pgx.Conn, gate time.Duration, wasBusy bool) (bool, error) {
	var settled bool
	if err := conn.QueryRow(ctx, `SELECT bridge.relay_waiting($1, $2)`, max(1, int(gate/time.Millisecond)), wasBusy).Scan(&settled); err != nil {
		return false, fmt.Errorf("declare the relay waiting: %w", err)
	}
	return settled, nil
}

// RelayGate waits up to gate, for a relay already waiting, for the commits
// that skipped their notification to be visible (after a RelayWaiting whose
// wait timed out). It returns false when it timed out again.
func RelayGate(ctx context.Context, conn *pgx.Conn, gate time.Duration) (bool, error) {
	var settled bool
	if err := conn.QueryRow(ctx, `SELECT bridge.relay_gate($1)`, max(1, int(gate/time.Millisecond))).Scan(&settled); err != nil {
		return false, fmt.Errorf("wait for the commits that did not notify: %w", err)
	}
	return settled, nil
}
