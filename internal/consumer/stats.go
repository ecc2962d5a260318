package consumer

import "sync/atomic"

// Stats are the consumer's counters since New, for metrics and tests.
type Stats struct {
	// Batches: polled batches stored (and dead-lettered) completely.
	Batches int64
	// Records: records handled, whatever the outcome.
	Records int64
	// Duplicates: records whose dedup id was already in the inbox (or
	// earlier in the same batch); they added nothing.
	Duplicates int64
	// Deliveries: delivery rows created.
	Deliveries int64
	// DeadLettered: records produced to "<topic>.dlq".
	DeadLettered int64
	// CommitFailures: offset commits that failed after their batch was
	// stored; those records are redelivered and deduplicated.
	CommitFailures int64
	// InboxPruned: inbox rows deleted past the dedup window.
	InboxPruned int64
}

type counters struct {
	batches, records, duplicates, deliveries, deadLettered, commitFailures, inboxPruned atomic.Int64
}

// Stats returns a snapshot of the counters.
func (c *Consumer) Stats() Stats {
	s := &c.stats
	return Stats{
		Batches:        s.batches.Load(),
		Records:        s.records.Load(),
		Duplicates:     s.duplicates.Load(),
		Deliveries:     s.deliveries.Load(),
		DeadLettered:   s.deadLettered.Load(),
		CommitFailures: s.commitFailures.Load(),
		InboxPruned:    s.inboxPruned.Load(),
	}
}
