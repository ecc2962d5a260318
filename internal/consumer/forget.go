package consumer

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// Execer runs one statement (a pool, a connection or a transaction).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// ForgetTopic deletes the inbox rows of a topic whose records will never be
// read again (a finished demo run's own topic). For any other topic it would
// let a redelivered record make its deliveries a second time.
func ForgetTopic(ctx context.Context, db Execer, topic string) error {
	if _, err := db.Exec(ctx, deleteTopicInbox, topic); err != nil {
		return fmt.Errorf("delete the inbox rows of topic %s: %w", topic, err)
	}
	return nil
}
