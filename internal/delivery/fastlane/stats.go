package fastlane

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// Stats and gauges: what the lane reports to the metrics and the console.

// Stats are the lane's figures since it started.
type Stats struct {
	Records    int64 // records read
	Delivered  int64 // deliveries posted with a 2xx answer
	Failed     int64 // attempts that failed (each parked its stream)
	HandedOver int64 // deliveries written to bridge.deliveries
	Duplicates int64 // adjacent repeats of a dedup-id dropped
	// DeadLettered: records produced to "<topic>.dlq" (unreadable, or
	// refused by PostgreSQL at a hand-over).
	DeadLettered int64
	Unparked     int64 // streams that came back from the slow lane
	// Isolations: (subscription, partition) pairs handed to the slow lane
	// as a whole (see Config.IsolateAfter, Config.HoldLimit); Cut: requests
	// in flight cut by an isolation, their deliveries handed over.
	Isolations int64
	Cut        int64
	// InFlightLimit is the live limit on requests in flight (Workers when
	// Config.InFlightLimit is fixed); InFlightLimitLowest and
	// InFlightLimitHighest its range since the lane started.
	InFlightLimit, InFlightLimitLowest, InFlightLimitHighest int64
	// Polls: polls that returned records; LogFlushes and LogRows: the
	// attempt log's appends and the attempts they wrote; Commits: offset
	// commits sent. Each member pays these for itself: what a group of
	// members costs beyond one member's work.
	Polls, LogFlushes, LogRows, Commits int64
	// RouteChecks: checks of the subscriptions' version run because polled
	// records were newer than the routes held; RouteReads: the full reads
	// of the routes those checks led to (the version had changed).
	RouteChecks, RouteReads int64
}

// Stats returns the lane's figures so far.
func (l *Lane) Stats() Stats {
	return Stats{
		Records: l.stats.records.Load(), Delivered: l.stats.delivered.Load(), Failed: l.stats.failed.Load(),
		HandedOver: l.stats.handedOver.Load(), Duplicates: l.stats.duplicates.Load(), Unparked: l.stats.unparked.Load(),
		DeadLettered: l.stats.deadLettered.Load(),
		Isolations:   l.stats.isolations.Load(), Cut: l.stats.cut.Load(),
		InFlightLimit: l.stats.limit.Load(), InFlightLimitLowest: l.stats.limitLowest.Load(),
		InFlightLimitHighest: l.stats.limitHighest.Load(),
		Polls:                l.stats.polls.Load(), LogFlushes: l.stats.logFlushes.Load(), LogRows: l.stats.logRows.Load(),
		Commits: l.stats.commits.Load(), RouteChecks: l.stats.routeChecks.Load(), RouteReads: l.stats.routeReads.Load(),
	}
}

// PartitionGauge is one owned partition as the lane holds it.
type PartitionGauge struct {
	Topic     string
	Partition int32
	// Settled is the offset below which every record is settled (the
	// offset the next commit writes; -1: no record read yet).
	Settled int64
	// HighWatermark is the partition's end offset at the last fetch (-1:
	// unknown), Lag = HighWatermark − Settled: records not yet settled by
	// every subscription, read or not (-1 when either is unknown).
	HighWatermark, Lag int64
	// Held: records in memory (read, not yet committed past), HeldBytes
	// their bytes as counted against MaxBufferedBytes.
	Held      int
	HeldBytes int64
	// Isolated: subscriptions whose deliveries of this partition go
	// through the slow lane for now (see Config.IsolateAfter).
	Isolated int
}

// Gauges is the lane's state now, for the metrics.
type Gauges struct {
	Partitions []PartitionGauge
	// Streams: (subscription, asset) streams held in memory; Parked: those
	// of them whose deliveries go to the slow lane (bridge.deliveries).
	Streams, Parked int
	// Queued: deliveries waiting in the fast lane for their stream's
	// turn or a worker; InFlight: requests being sent.
	Queued, InFlight int
	// HeldBytes: record bytes held in memory (bounded by MaxBufferedBytes).
	HeldBytes int64
}

// Gauges returns the lane's state. It walks the streams held, under the
// lane's lock: call it at a scrape's pace, not per delivery.
func (l *Lane) Gauges() Gauges {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	g := Gauges{Streams: len(l.streams), InFlight: len(l.sending), HeldBytes: l.buffered}
	for _, s := range l.streams {
		if s.parked {
			g.Parked++
		}
		g.Queued += len(s.fast)
		if s.sending && len(s.fast) > 0 {
			g.Queued--
		}
	}
	for _, p := range l.parts {
		if p.revoked {
			continue
		}
		pg := PartitionGauge{Topic: p.tp.topic, Partition: p.tp.partition, Settled: p.next, HighWatermark: p.highWatermark,
			Held: len(p.recs), Lag: -1}
		for _, r := range p.recs {
			pg.HeldBytes += r.bytes
		}
		for _, r := range p.recs {
			if r.pending > 0 {
				pg.Settled = r.rec.Offset
				break
			}
		}
		if pg.Settled < 0 && p.committed >= 0 {
			pg.Settled = p.committed
		}
		if pg.Settled >= 0 && pg.HighWatermark >= 0 {
			pg.Lag = max(pg.HighWatermark-pg.Settled, 0)
		}
		for _, until := range p.isolated {
			if until.After(now) {
				pg.Isolated++
			}
		}
		g.Partitions = append(g.Partitions, pg)
	}
	slices.SortFunc(g.Partitions, func(a, b PartitionGauge) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return g
}
