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

// AttemptTimeout bounds one connection attempt: DATABASE_CONNECT_TIMEOUT
// when it is shorter, else 10s. Operator commands make one attempt (they
// fail fast); long-running commands make attempts until the whole
// DATABASE_CONNECT_TIMEOUT has passed (see internal/cli).
func AttemptTimeout(cfg config.Database) time.Duration {
	const most = 10 * time.Second
	if cfg.ConnectTimeout > 0 && cfg.ConnectTimeout < most {
		return cfg.ConnectTimeout
	}
	return most
}

// Open parses cfg and creates a pool without connecting yet; Addr is the
// server's address for messages (never the password).
func Open(cfg config.Database) (pool *pgxpool.Pool, addr string, err error) {
	pcfg, err := cfg.PoolConfig()
	if err != nil {
		return nil, "", err
	}
	pcfg.MaxConns = cfg.MaxConns
	if attempt := AttemptTimeout(cfg); pcfg.ConnConfig.ConnectTimeout == 0 || pcfg.ConnConfig.ConnectTimeout > attempt {
		pcfg.ConnConfig.ConnectTimeout = attempt
	}
	addr = net.JoinHostPort(pcfg.ConnConfig.Host, strconv.Itoa(int(pcfg.ConnConfig.Port)))
	pool, err = pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		return nil, "", &ConnectError{Addr: addr, Err: err}
	}
	return pool, addr, nil
}

// Ping makes one connection attempt through pool, bounded by timeout, and
// describes a failure as a ConnectError naming addr.
func Ping(ctx context.Context, pool *pgxpool.Pool, addr string, timeout time.Duration) error {
	pingCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		return &ConnectError{Addr: addr, Err: describeConnectError(err)}
	}
	return nil
}

// Connect opens a pool and makes one connection attempt (bounded by
// AttemptTimeout), so a wrong DATABASE_URL fails the command at start with a
// clear message instead of at the first query.
func Connect(ctx context.Context, cfg config.Database) (*pgxpool.Pool, error) {
	pool, addr, err := Open(cfg)
	if err != nil {
		return nil, err
	}
	if err := Ping(ctx, pool, addr, AttemptTimeout(cfg)); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// describeConnectError strips pgconn's wrapping (which may repeat the DSN's
// host and user) down to the reason.
func describeConnectError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgReason{pgErr}
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

// pgReason is a PostgreSQL error as a connect error reports it: its message
// and SQLSTATE, without pgconn's wrapping; the error itself stays reachable
// (IsAuthFailure).
type pgReason struct{ err *pgconn.PgError }

func (r pgReason) Error() string { return fmt.Sprintf("%s (SQLSTATE %s)", r.err.Message, r.err.Code) }
func (r pgReason) Unwrap() error { return r.err }

// IsAuthFailure reports a refusal waiting cannot cure: SQLSTATE class 28,
// invalid authorization (28P01 a wrong password, 28000 no such role or no
// pg_hba.conf entry). A command waiting for PostgreSQL gives up on it at
// once, with the reason, instead of retrying it like an outage for
// DATABASE_CONNECT_TIMEOUT.
func IsAuthFailure(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "28")
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
