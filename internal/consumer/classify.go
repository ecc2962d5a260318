package consumer

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// errorClass is what the consumer does with a failed batch transaction.
type errorClass int

const (
	// transient: the same batch can succeed later (PostgreSQL unreachable
	// or restarting, a serialization failure, a deadlock, a concurrent
	// change, anything unknown). The whole batch is retried with backoff;
	// nothing is dead-lettered.
	transient errorClass = iota
	// recordFault: PostgreSQL refused the data of some record, and
	// retrying the same records can never succeed. The batch is split
	// until the offending records are alone; they are dead-lettered with
	// the reason and the rest commits.
	recordFault
)

func (c errorClass) String() string {
	if c == recordFault {
		return "record fault"
	}
	return "transient"
}

// classify decides whether err, from a batch's transaction, is the data's
// fault. Only a PostgreSQL error of a class that depends on the values
// written is: every other error (network, context, pool) is transient.
//
//   - class 22, data exception: invalid text (22021 a byte sequence invalid
//     in the encoding, 22P05 a \u0000 in jsonb), a number out of range
//     (22003), a string too long (22001), …;
//   - class 54, program limit exceeded: 54000 index row size (a value past
//     what a btree entry holds), 54001 statement too complex (a batch too
//     large — splitting it cures that too);
//   - class 23, integrity constraint, for the constraints a record's own
//     values violate: not null (23502), check (23514), unique (23505: the
//     inbox's ON CONFLICT and the batch's own dedup leave no race that
//     raises it). A foreign key (23503) is not: a subscription deleted
//     between reading the routes and writing its deliveries is a
//     concurrent change, and the retry reads the routes again.
//
// The transient classes — 08 connection exception, 40001 serialization
// failure, 40P01 deadlock, 57P0x operator intervention (shutdown, crash
// recovery), 53 insufficient resources, 55P03 lock not available — are
// retried as a whole, like any error not listed above.
func classify(err error) errorClass {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return transient
	}
	code := pgErr.Code
	switch {
	case strings.HasPrefix(code, "22"), strings.HasPrefix(code, "54"):
		return recordFault
	case code == "23502", code == "23514", code == "23505":
		return recordFault
	}
	return transient
}
