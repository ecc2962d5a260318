package service

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/logging"
)

// Listener configures Listen.
type Listener struct {
	// Pool supplies the connection settings. The LISTEN connection is opened
	// from its config, not taken from it: a connection that carries LISTEN
	// state must never serve other queries, and the pool keeps its full size
	// for them. Required.
	Pool *pgxpool.Pool
	// Channel to LISTEN on (an identifier, e.g. "bridge_outbox"). Required.
	Channel string
	// Backoff between reconnect attempts. Zero value: 100ms doubling to 5s,
	// ±20%.
	Backoff Backoff
	// Logger: one warning when the connection is lost, one line when it is
	// back. Nil: discard.
	Logger *slog.Logger
	// Connected, if set, is called each time LISTEN is in place (first
	// connect and every reconnect), before the wake-up: notifications sent
	// while nobody listened are lost, and a reader that relies on their
	// payloads must assume it missed some.
	Connected func()
	// Notified, if set, receives each notification's payload, before the
	// wake-up it causes.
	Notified func(payload string)
}

// Listen holds a LISTEN on l.Channel until ctx ends, reconnecting with capped
// backoff whenever the connection fails. Each notification becomes a wake-up
// on wake; so does each (re)connect, because rows may have been committed
// while nobody listened. Sends never block: make wake buffered (capacity 1)
// so a wake-up that arrives while the reader is busy is kept, and further
// ones coalesce into it. A lost connection costs latency only: the reader
// should still poll on a timer as a fallback.
func Listen(ctx context.Context, l Listener, wake chan<- struct{}) {
	log := l.Logger
	if log == nil {
		log = logging.Discard()
	}
	log = log.With("channel", l.Channel)
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	failures := 0
	for ctx.Err() == nil {
		err := listenOnce(ctx, l, func() {
			if failures > 0 {
				log.InfoContext(ctx, "LISTEN connection back", "after_failures", failures)
			}
			failures = 0
			if l.Connected != nil {
				l.Connected()
			}
			poke()
		}, func(payload string) {
			if l.Notified != nil {
				l.Notified(payload)
			}
			poke()
		})
		if ctx.Err() != nil {
			return
		}
		failures++
		if failures == 1 {
			log.WarnContext(ctx, "LISTEN connection lost; reconnecting (polling meanwhile)", "error", err)
		} else {
			log.DebugContext(ctx, "LISTEN reconnect failed", "error", err, "failures", failures)
		}
		if !Sleep(ctx, l.Backoff.Delay(failures)) {
			return
		}
	}
}

func listenOnce(ctx context.Context, l Listener, connected func(), notified func(payload string)) error {
	cfg := l.Pool.Config().ConnConfig
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.Channel}.Sanitize()); err != nil {
		return fmt.Errorf("listen %s: %w", l.Channel, err)
	}
	connected()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		notified(n.Payload)
	}
}
