// Package kafkawindow reads a time window of the event topics back from
// Kafka and queues it for one subscription in its slow lane
// (bridge.deliveries): the fast lane keeps no delivery rows, so the events it
// delivered are in the topics only.
//
// The window is found by time (ListOffsets by timestamp: the first record at
// or after since, and at or after until), never by scanning. A window that
// starts before what a partition still holds — records were deleted by the
// topic's retention and the oldest left is younger than since — is refused
// with the earliest time still available, before anything is written: a
// recovery that silently skipped the deleted part would look complete.
package kafkawindow

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// Range is the records of one partition in a window: offsets [From, To).
type Range struct {
	Topic     string
	Partition int32
	From, To  int64
}

// RetentionError is a window that starts before what a topic still holds.
type RetentionError struct {
	Topic     string
	Partition int32
	Since     time.Time
	// Earliest is the earliest time from which every partition of the
	// topic still holds its records; the zero time when a partition holds
	// none any more (everything it had is past retention).
	Earliest time.Time
}

func (e *RetentionError) Error() string {
	if e.Earliest.IsZero() {
		return fmt.Sprintf("since %s is past the retention of topic %s: partition %d holds no records any more; nothing before now can be read from Kafka",
			e.Since.UTC().Format(time.RFC3339), e.Topic, e.Partition)
	}
	return fmt.Sprintf("since %s is past the retention of topic %s (partition %d): the earliest time still available is %s",
		e.Since.UTC().Format(time.RFC3339), e.Topic, e.Partition, e.Earliest.UTC().Format(time.RFC3339Nano))
}

// Plan finds the offsets of the window [since, until) in every partition of
// topics (until nil: up to the end offsets as they are now). It refuses a
// window that starts before a partition's retained records with a
// *RetentionError naming the earliest time still available.
func Plan(ctx context.Context, adm *kadm.Client, topics []string, since time.Time, until *time.Time) ([]Range, error) {
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list start offsets of %v: %w", topics, err)
	}
	firsts, err := listAfter(ctx, adm, 0, topics)
	if err != nil {
		return nil, err
	}
	froms, err := listAfter(ctx, adm, since.UnixMilli(), topics)
	if err != nil {
		return nil, err
	}
	hws, err := adm.ListEndOffsets(ctx, topics...)
	if err == nil {
		err = hws.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list end offsets of %v: %w", topics, err)
	}
	ends := hws
	if until != nil {
		if ends, err = listAfter(ctx, adm, until.UnixMilli(), topics); err != nil {
			return nil, err
		}
	}
	var out []Range
	for _, topic := range topics {
		parts, ok := starts[topic]
		if !ok {
			return nil, fmt.Errorf("topic %s does not exist", topic)
		}
		if err := checkRetention(topic, parts, hws[topic], firsts[topic], since); err != nil {
			return nil, err
		}
		for p := range parts {
			from, to := froms[topic][p].Offset, ends[topic][p].Offset
			if from >= 0 && from < to {
				out = append(out, Range{Topic: topic, Partition: p, From: from, To: to})
			}
		}
	}
	slices.SortFunc(out, func(a, b Range) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out, nil
}

// checkRetention refuses since when a partition of topic has lost records
// to retention (its start offset is above 0) and its oldest record left is
// younger than since. The earliest time named is the youngest of those
// oldest records: from then on every partition still holds everything.
func checkRetention(topic string, starts, hws, firsts map[int32]kadm.ListedOffset, since time.Time) error {
	var refused *RetentionError
	for p, start := range starts {
		if start.Offset <= 0 {
			continue // nothing deleted yet: the partition holds all it ever had
		}
		if start.Offset >= hws[p].Offset || firsts[p].Offset < 0 {
			// Every record it had is past retention.
			return &RetentionError{Topic: topic, Partition: p, Since: since}
		}
		oldest := time.UnixMilli(firsts[p].Timestamp)
		if oldest.After(since) && (refused == nil || oldest.After(refused.Earliest)) {
			refused = &RetentionError{Topic: topic, Partition: p, Since: since, Earliest: oldest}
		}
	}
	if refused != nil {
		return refused
	}
	return nil
}

// listAfter lists, per partition, the first offset whose record's
// timestamp is at or after ms (the end offset when there is none).
func listAfter(ctx context.Context, adm *kadm.Client, ms int64, topics []string) (kadm.ListedOffsets, error) {
	l, err := adm.ListOffsetsAfterMilli(ctx, ms, topics...)
	if err == nil {
		err = l.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list offsets of %v after %s: %w", topics, time.UnixMilli(ms).UTC().Format(time.RFC3339), err)
	}
	return l, nil
}

// Read calls fn with the records of ranges, each partition's in offset
// order, in the batches the fetches return, until every range is read.
func Read(ctx context.Context, opts []kgo.Opt, ranges []Range, fn func([]*kgo.Record) error) error {
	if len(ranges) == 0 {
		return nil
	}
	offsets := map[string]map[int32]kgo.Offset{}
	left := map[Range]bool{}
	type tp struct {
		t string
		p int32
	}
	want := map[tp]Range{}
	for _, r := range ranges {
		if offsets[r.Topic] == nil {
			offsets[r.Topic] = map[int32]kgo.Offset{}
		}
		offsets[r.Topic][r.Partition] = kgo.NewOffset().At(r.From)
		left[r] = true
		want[tp{r.Topic, r.Partition}] = r
	}
	cl, err := kgo.NewClient(append(slices.Clone(opts), kgo.ConsumePartitions(offsets))...)
	if err != nil {
		return fmt.Errorf("create kafka client to read the window: %w", err)
	}
	defer cl.Close()
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				ferr = errors.Join(ferr, fmt.Errorf("read %s/%d: %w", t, p, err))
			}
		})
		if ferr != nil {
			return ferr
		}
		var batch []*kgo.Record
		fs.EachPartition(func(f kgo.FetchTopicPartition) {
			r := want[tp{f.Topic, f.Partition}]
			for _, rec := range f.Records {
				if rec.Offset >= r.To {
					delete(left, r)
					break
				}
				batch = append(batch, rec)
				if rec.Offset == r.To-1 {
					delete(left, r)
				}
			}
		})
		if len(batch) > 0 {
			if err := fn(batch); err != nil {
				return err
			}
		}
		if len(left) > 0 {
			// Stop fetching partitions that are done.
			var done = map[string][]int32{}
			for _, r := range ranges {
				if !left[r] {
					done[r.Topic] = append(done[r.Topic], r.Partition)
				}
			}
			cl.PauseFetchPartitions(done)
		}
	}
	return nil
}

// Result is what Recover did.
type Result struct {
	Read        int // records read in the window
	Queued      int // deliveries written (events with no delivery row for the subscription yet)
	Undecodable int // records that are not events (they were dead-lettered when first read)
}

// Recover reads the window [since, until) of topics and queues every event
// matching filter for subscriptionID in bridge.deliveries, in partition
// order, so each (subscription, asset) stream gets them in its asset order,
// behind what it has pending. An event the subscription already has a row
// for (pending, dead or delivered in the slow lane) is not queued twice. Each
// fetch batch is one transaction; the insert parks the streams it touches,
// so the fast lane queues their later events behind them.
func Recover(ctx context.Context, pool *pgxpool.Pool, opts []kgo.Opt, values contract.ValueDecoder,
	subscriptionID string, filter contract.Filter, topics []string, w store.Window) (Result, error) {
	ranges, err := planWindow(ctx, opts, topics, w)
	if err != nil {
		return Result{}, err
	}
	return queue(ctx, pool, opts, values, subscriptionID, filter, ranges)
}

// planWindow is Plan with a client of its own.
func planWindow(ctx context.Context, opts []kgo.Opt, topics []string, w store.Window) ([]Range, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	defer cl.Close()
	return Plan(ctx, kadm.NewClient(cl), topics, w.Since, w.Until)
}

// queue reads ranges and writes their events matching filter as deliveries
// of subscriptionID (see Recover).
func queue(ctx context.Context, pool *pgxpool.Pool, opts []kgo.Opt, values contract.ValueDecoder,
	subscriptionID string, filter contract.Filter, ranges []Range) (Result, error) {
	var res Result
	err := Read(ctx, opts, ranges, func(recs []*kgo.Record) error {
		var f store.Fanout
		for _, r := range recs {
			res.Read++
			m, err := contract.DecodeWith(ctx, r, values)
			if err != nil {
				if !isDecodeError(err) {
					// The schema registry cannot answer: stop rather than skip
					// events that are fine. What is written stays; a second
					// run writes each event once.
					return err
				}
				res.Undecodable++
				continue
			}
			if !filter.Matches(r.Topic, m.EventType) {
				continue
			}
			ev := f.AddEvent(store.Event{ID: m.DedupID, Type: m.EventType, Topic: r.Topic, AssetID: m.AssetID, AssetSeq: m.AssetSeq,
				Payload: string(m.Payload), CreatedAt: m.CreatedAt, Traceparent: m.Traceparent, Tracestate: m.Tracestate})
			f.Deliver(ev, subscriptionID)
		}
		if f.Len() == 0 {
			return nil
		}
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			n, err := store.EnqueueCount(ctx, tx, &f)
			res.Queued += int(n)
			return err
		})
	})
	return res, err
}

// Recovery is what RecoverWindow did.
type Recovery struct {
	// IDs are the dead deliveries revived, oldest first.
	IDs []int64
	// Kafka is what was read from the topics; nil without the fast lane.
	Kafka *Result
}

// RecoverWindow is the one rule behind `bridge deliveries recover`, the
// admin API's recover and the console's: revive the subscription's dead
// deliveries created in w and, with the fast lane (src not nil), queue the
// window's events read from the topics (Source.Recover). The window is
// checked against the topics' retention before anything is written: a
// *RetentionError revives nothing.
func RecoverWindow(ctx context.Context, pool *pgxpool.Pool, st *store.DeliveryStore, src *Source, sub *store.Subscription,
	w store.Window) (Recovery, error) {
	var rec Recovery
	var ranges []Range
	topics := src.topicsFor(sub.Topic)
	if len(topics) > 0 {
		var err error
		if ranges, err = planWindow(ctx, src.Opts, topics, w); err != nil {
			return rec, err
		}
	}
	ids, err := st.RecoverWindow(ctx, sub.ID, w)
	if err != nil {
		return rec, err
	}
	rec.IDs = ids
	if src == nil {
		return rec, nil
	}
	filter := contract.Filter{Enabled: true, EventTypes: sub.EventTypes, Topic: sub.Topic}
	res, err := queue(ctx, pool, src.Opts, src.Values, sub.ID, filter, ranges)
	rec.Kafka = &res
	return rec, err
}

// isDecodeError: the record's own fault (it was dead-lettered when first
// read), as opposed to a schema registry that cannot answer now.
func isDecodeError(err error) bool {
	var de *contract.DecodeError
	return errors.As(err, &de)
}

// Source is where a fast-lane installation reads windows from: the event
// topics the fast lane reads (CONSUMER_TOPICS) on the cluster of opts.
// `bridge deliveries recover` and the admin API's recover build it from the
// same settings (SourceFromConfig), so both read the same topics.
type Source struct {
	Opts   []kgo.Opt
	Topics []string
	// Values decodes record values (the schema registry); nil: JSON.
	Values contract.ValueDecoder
	// Settle: a history is read this long after its subscription was
	// created, once every fast-lane member routes to it. Default
	// RouteSettle; it must exceed the members' refresh interval.
	Settle time.Duration
}
