package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxbridge/bridge/internal/database/statement"
)

// DB is what the stores need from PostgreSQL; *pgxpool.Pool satisfies it.
// Unlike a bare statement.DB it can begin its own transactions.
type DB interface {
	statement.DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Querier is what both a transaction and a savepoint offer: the consumer
// writes deliveries inside its own batch transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// ErrNotFound is returned for an unknown subscription or delivery id.
var ErrNotFound = errors.New("not found")

// ValidationError names the input field at fault (the CLI exits 2 with it).
type ValidationError struct {
	Field   string
	Value   string
	Problem string
}

func (e *ValidationError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s %s", e.Field, e.Problem)
	}
	return fmt.Sprintf("%s %q %s", e.Field, e.Value, e.Problem)
}

// notFound translates pgx.ErrNoRows into ErrNotFound, in one place.
func notFound(what, id string, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s %s: %w", what, id, ErrNotFound)
	}
	return fmt.Errorf("read %s %s: %w", what, id, err)
}
