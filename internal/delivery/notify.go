package delivery

import (
	"cmp"
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/service"
)

// NotifierConfig configures the Notifier.
type NotifierConfig struct {
	// Pool supplies the connection settings of the dedicated LISTEN
	// connection. Required.
	Pool *pgxpool.Pool
	// Channel to LISTEN on. Default "bridge_deliveries", where the
	// deliveries trigger announces new rows.
	Channel string
	// Wake is called on every notification and every (re)connect. Default:
	// nothing.
	Wake func()
	// Logger. Default: discard.
	Logger *slog.Logger
}

func (c NotifierConfig) withDefaults() NotifierConfig {
	c.Channel = cmp.Or(c.Channel, notifyChannel)
	if c.Wake == nil {
		c.Wake = func() {}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Notifier is the service that turns NOTIFY bridge_deliveries into wake-ups
// of the claim loops, so a new delivery goes out without waiting for the
// poll tick. A lost connection costs latency only: the claim loops still
// poll every WEBHOOK_POLL_INTERVAL.
type Notifier struct{ cfg NotifierConfig }

// NewNotifier returns a Notifier; zero fields of cfg take their defaults.
func NewNotifier(cfg NotifierConfig) *Notifier { return &Notifier{cfg: cfg.withDefaults()} }

func (n *Notifier) Name() string { return "listen for new deliveries" }

// Run listens until ctx ends.
func (n *Notifier) Run(ctx context.Context) {
	notified := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		service.Listen(ctx, service.Listener{Pool: n.cfg.Pool, Channel: n.cfg.Channel, Logger: n.cfg.Logger}, notified)
	}()
	for {
		select {
		case <-ctx.Done():
			<-done
			return
		case <-notified:
			n.cfg.Wake()
		}
	}
}
