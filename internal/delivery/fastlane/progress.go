package fastlane

import (
	"context"
	"fmt"
)

// Progress grows with every record the lane reads and every delivery it
// settles (posted with a 2xx, failed, handed to the slow lane, or dropped as
// an adjacent repeat). With Waiting it tells a lane that is stuck (a
// hand-over PostgreSQL keeps refusing, a poll held while the schema
// registry is down) from one with nothing to do (internal/progress,
// /readyz check fast_lane_progress).
func (l *Lane) Progress() int64 {
	s := l.Stats()
	return s.Records + s.Delivered + s.Failed + s.HandedOver + s.Duplicates
}

// Waiting says whether records of the partitions this member owns wait for
// it: records not yet settled by every subscription, read or not ("" when
// none does). A partition's end offset is the one its last fetch saw.
func (l *Lane) Waiting(context.Context) (string, error) {
	var lag, held int64
	for _, p := range l.Gauges().Partitions {
		if p.Lag > 0 {
			lag += p.Lag
		}
		held += int64(p.Held)
	}
	if n := l.awaiting.Load(); n > 0 {
		return fmt.Sprintf("%d records polled wait for a check of the subscriptions' version (%d records of its partitions not settled)", n, lag), nil
	}
	if lag == 0 {
		return "", nil
	}
	return fmt.Sprintf("%d records of its partitions are not settled by every subscription (%d of them in memory)", lag, held), nil
}
