package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestClassifyBatchErrors(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "m"} }
	wrapped := func(err error) error { return fmt.Errorf("store batch (deliveries, commit): %w", err) }
	cases := []struct {
		name string
		err  error
		want errorClass
	}{
		{"index row size (54000)", pg("54000"), recordFault},
		{"statement too complex (54001)", pg("54001"), recordFault},
		{"invalid byte sequence (22021)", pg("22021"), recordFault},
		{"jsonb \\u0000 (22P05)", pg("22P05"), recordFault},
		{"numeric out of range (22003)", pg("22003"), recordFault},
		{"string too long (22001)", pg("22001"), recordFault},
		{"invalid parameter value (22023)", pg("22023"), recordFault},
		{"not null (23502)", pg("23502"), recordFault},
		{"check (23514)", pg("23514"), recordFault},
		{"unique (23505)", pg("23505"), recordFault},
		{"wrapped data exception", wrapped(pg("22P02")), recordFault},
		{"foreign key: a subscription deleted meanwhile (23503)", pg("23503"), transient},
		{"serialization failure (40001)", pg("40001"), transient},
		{"deadlock (40P01)", pg("40P01"), transient},
		{"admin shutdown (57P01)", pg("57P01"), transient},
		{"crash shutdown (57P02)", pg("57P02"), transient},
		{"cannot connect now (57P03)", pg("57P03"), transient},
		{"connection failure (08006)", pg("08006"), transient},
		{"connection does not exist (08003)", pg("08003"), transient},
		{"too many connections (53300)", pg("53300"), transient},
		{"disk full (53100)", pg("53100"), transient},
		{"lock not available (55P03)", pg("55P03"), transient},
		{"query canceled (57014)", pg("57014"), transient},
		{"wrapped deadlock", wrapped(pg("40P01")), transient},
		{"network", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, transient},
		{"eof", io.ErrUnexpectedEOF, transient},
		{"context", context.DeadlineExceeded, transient},
		{"unknown", errors.New("something else"), transient},
	}
	for _, c := range cases {
		if got := classify(c.err); got != c.want {
			t.Errorf("%s: classify(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
