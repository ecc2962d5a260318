package relay

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/outboxstore"
)

// wakeState tells the writers whether this relay needs their commits'
// notifications (migration 00160). A relay that found rows claims again at
// once and is "busy": commits skip the NOTIFY, whose lock made every
// notifying commit wait for the one before it, WAL flush included. A relay
// that found nothing says it is "waiting", waits for the commits that
// skipped their notification to be visible, claims once more, and only then
// blocks until a notification.
//
// The states are session advisory locks on a connection of the relay's own:
// if it drops (or cannot be had), the relay holds neither, and writers notify
// unless another relay is busy — the poll interval covers that case.
type wakeState struct {
	pool *pgxpool.Pool
	log  *slog.Logger
	// gate bounds each wait for the commits that skipped their
	// notification; when it times out (a slow commit, or a writer whose
	// deferred trigger ran early and that holds the gate while it works
	// on), the relay claims and waits again, so such rows wait at most
	// about this long.
	gate time.Duration

	mu      sync.Mutex
	conn    *pgx.Conn // nil: holds no state
	held    heldState
	settled bool // WAITING, and the gate was passed since
	// unavailable: the last attempt to open or use the connection failed;
	// the relay then blocks relying on notifications and its poll
	// interval, and tries again once it finds work.
	unavailable bool
	warnedAt    time.Time
}

type heldState int

const (
	holdsNothing heldState = iota
	holdsBusy
	holdsWaiting
)

// wakeGateTimeout bounds one wait for the commits that skipped their
// notification (capped at the poll interval). They hold the gate from their
// commit's start until it is visible, one WAL flush — but on a machine
// short of CPU a flush sometimes takes 100 ms and more, and meanwhile the
// relay claims nothing, not even the rows of commits that did notify it. A
// wait that times out is followed by a claim and another wait, so the
// relay claims at least this often while it is at the gate.
const wakeGateTimeout = 20 * time.Millisecond

func newWakeState(pool *pgxpool.Pool, log *slog.Logger, gate time.Duration) *wakeState {
	return &wakeState{pool: pool, log: log, gate: gate}
}

// readyToBlock reports whether the relay may block until a notification:
// it waits and every commit that did not notify it is visible to its next
// claim — or its connection is unavailable.
func (w *wakeState) readyToBlock() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.unavailable || (w.held == holdsWaiting && w.settled)
}

// isBusy reports whether the relay holds BUSY.
func (w *wakeState) isBusy() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.held == holdsBusy
}

// busy is called after a cycle that found work: the relay claims again at
// once.
func (w *wakeState) busy(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.held == holdsBusy || !w.connect(ctx) {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	var err error
	if w.held == holdsWaiting {
		err = outboxstore.RelayBusyAgain(qctx, w.conn)
	} else {
		err = outboxstore.RelayBusy(qctx, w.conn)
	}
	if err != nil {
		w.drop(ctx, err)
		return
	}
	w.held, w.settled = holdsBusy, false
}

// wait is called after a cycle that found nothing, while readyToBlock is
// false: declare the relay waiting and pass the gate. The claim after it
// sees every commit that did not notify.
func (w *wakeState) wait(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.connect(ctx) {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, w.gate+database.QueryTimeout)
	defer cancel()
	var settled bool
	var err error
	if w.held == holdsWaiting {
		settled, err = outboxstore.RelayGate(qctx, w.conn, w.gate)
	} else {
		settled, err = outboxstore.RelayWaiting(qctx, w.conn, w.gate, w.held == holdsBusy)
	}
	if err != nil {
		w.drop(ctx, err)
		return
	}
	w.held, w.settled = holdsWaiting, settled
}

// connect opens the state's connection if there is none (mu held).
func (w *wakeState) connect(ctx context.Context) bool {
	if w.conn != nil {
		return true
	}
	cctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, w.pool.Config().ConnConfig.Copy())
	if err != nil {
		w.unavailable = true
		w.warn(ctx, "connect", err)
		return false
	}
	w.conn, w.held, w.settled, w.unavailable = conn, holdsNothing, false, false
	return true
}

// drop closes the connection, which releases whatever it held (mu held).
func (w *wakeState) drop(ctx context.Context, err error) {
	w.warn(ctx, "declare the relay's state", err)
	w.closeLocked()
	w.unavailable = true
}

func (w *wakeState) closeLocked() {
	if w.conn != nil {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = w.conn.Close(cctx)
		cancel()
		w.conn = nil
	}
	w.held, w.settled = holdsNothing, false
}

// close releases the state (shutdown).
func (w *wakeState) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closeLocked()
}

func (w *wakeState) warn(ctx context.Context, what string, err error) {
	if ctx.Err() != nil || time.Since(w.warnedAt) < 10*time.Second {
		return
	}
	w.warnedAt = time.Now()
	w.log.WarnContext(ctx, "relay wake-up state: "+what+" failed; until it is back the relay relies on notifications and its poll interval",
		"error", err)
}
