// Package database connects to PostgreSQL and applies the bridge's migrations.
package database

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/config"
)

// ConnectError says PostgreSQL could not be reached; its message names the
// address and never the password.
type ConnectError struct {
	Addr string
	Err  error
}

func (e *ConnectError) Error() string {
	return fmt.Sprintf("cannot connect to PostgreSQL at %s: %v", e.Addr, e.Err)
}

func (e *ConnectError) Unwrap() error { return e.Err }

// Connect opens a pool and waits (up to cfg.ConnectTimeout) until one
// connection works, so a wrong DATABASE_URL fails the command at start with a
// clear message instead of at the first query.
func Connect(ctx context.Context, cfg config.Database) (*pgxpool.Pool, error) {
	pcfg, err := cfg.PoolConfig()
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = cfg.MaxConns
	if pcfg.ConnConfig.ConnectTimeout == 0 || pcfg.ConnConfig.ConnectTimeout > cfg.ConnectTimeout {
		pcfg.ConnConfig.ConnectTimeout = cfg.ConnectTimeout
	}
	addr := net.JoinHostPort(pcfg.ConnConfig.Host, strconv.Itoa(int(pcfg.ConnConfig.Port)))
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, &ConnectError{Addr: addr, Err: err}
	}
	pingCtx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, &ConnectError{Addr: addr, Err: describeConnectError(err)}
	}
	return pool, nil
}

// describeConnectError strips pgconn's wrapping (which may repeat the DSN's
// host and user) down to the reason.
func describeConnectError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Errorf("%s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		if u := errors.Unwrap(ce); u != nil {
			if j, ok := u.(interface{ Unwrap() []error }); ok {
				// One failure per address tried (sslmode=prefer tries TLS,
				// then plain): errors.Join puts each on its own line.
				return joinedOneLine(j.Unwrap())
			}
			return u
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return errors.New("timed out")
	}
	return err
}

// joinedOneLine is errors.Join on one line ("a; b"), so the connect error
// stays a single log or terminal line.
type joinedOneLine []error

func (j joinedOneLine) Error() string {
	parts := make([]string, len(j))
	for i, e := range j {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}

func (j joinedOneLine) Unwrap() []error { return j }

// QueryTimeout bounds one maintenance or bookkeeping query, so a stuck
// statement cannot stall a service loop forever.
const QueryTimeout = 30 * time.Second
