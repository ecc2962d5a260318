// Package statement is what every table owner's statements share: the DB
// they run on, Select (the query-and-collect-by-name every list read does)
// and Acted (how an operator's write by ids reports each id it was given).
// It is a leaf (pgx only), so the application-side outbox package, which
// imports outboxstore, does not pull in the migrations or the configuration.
package statement

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what a table owner's statements run on: *pgxpool.Pool, *pgx.Conn and
// pgx.Tx all satisfy it. The stores (outboxstore, delivery/store) take it, or
// embed it, so every one of them accepts the same pool or transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Querier is the least a read needs: a DB, a transaction or a savepoint.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Select runs sql on q and collects its rows into T by column name
// (pgx.RowToStructByName: a column without a field, or a field without a
// column, is an error rather than a silently zero value). Either step's error
// is wrapped with what ("list failed outbox rows"), so the caller's error says
// which read failed.
func Select[T any](ctx context.Context, q Querier, what, sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[T])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// LeftAlone is an id an operator's write (revive, replay) was given and left
// alone, and why.
type LeftAlone[ID any] struct {
	ID     ID     `json:"id"`
	Reason string `json:"reason"` // "no such delivery", "is SENT, not FAILED", …
}

// Acted sorts the ids an operator's write was given by what became of each:
// done, or left alone with the reason. Reporting every id given keeps a
// mistyped or already handled id from vanishing into a bare count.
type Acted[ID any] struct {
	Done []ID
	Left []LeftAlone[ID]
}

// Scan reads one row of such a write's statement — the id, whether it was
// acted on, and its status before (NULL: no such row) — into a: a row not
// acted on is left alone as "no such <noun>" or "is <status>, not <wanted>".
func (a *Acted[ID]) Scan(rows pgx.Rows, noun, wanted string) error {
	var id ID
	var ok bool
	var status *string
	if err := rows.Scan(&id, &ok, &status); err != nil {
		return err
	}
	switch {
	case ok:
		a.Done = append(a.Done, id)
	case status == nil:
		a.Left = append(a.Left, LeftAlone[ID]{ID: id, Reason: "no such " + noun})
	default:
		a.Left = append(a.Left, LeftAlone[ID]{ID: id, Reason: "is " + *status + ", not " + wanted})
	}
	return nil
}
