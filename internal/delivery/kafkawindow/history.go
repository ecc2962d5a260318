package kafkawindow

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// RouteSettle is Source.Settle's default: how long after a subscription is created its history is
// read: by then every fast-lane member has read the subscriptions again
// (every second) and routes the topics' new records to it — into the slow
// lane, since its streams park while its history is copied. The copy reads
// up to the end offsets as they are after that wait, so every record is
// either read by the copy or routed live (or both: the delivery is then
// written once, in the history's place).
const RouteSettle = 10 * time.Second

// CheckSince refuses, before a subscription is created, a history that
// reaches past what its topics still hold (a *RetentionError naming the
// earliest time still available).
func (s *Source) CheckSince(ctx context.Context, topic string, since time.Time) error {
	topics := s.topicsFor(topic)
	if len(topics) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(s.Opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	_, err = Plan(ctx, kadm.NewClient(cl), topics, since, nil)
	return err
}

// topicsFor is the topics a subscription of topic ("": any) can receive
// from: none for a nil Source.
func (s *Source) topicsFor(topic string) []string {
	if s == nil {
		return nil
	}
	var topics []string
	for _, t := range s.Topics {
		if topic == "" || topic == t {
			topics = append(topics, t)
		}
	}
	return topics
}

// CopyHistory copies the history of the oldest subscription created with
// --since that needs one, reading it from the topics by time: the records
// from since up to the end offsets read RouteSettle after the subscription
// was created, in partition order, each fetch batch one transaction. It is
// the HistoryCopier's round when the fast lane is on, in place of the copy
// from the outbox (which reaches back only RELAY_RETENTION).
//
// One copier at a time copies a subscription's history (store.TakeHistory:
// another replica's copier skips it), and each batch records how many
// deliveries the copy has written so far. A copy interrupted (the process
// stopped) starts again from since: writing an event twice renumbers it,
// never doubles it, and the subscription is not served until the copy is
// marked done. A history that retention has
// overtaken since the subscription was created is copied from the earliest
// time still available, and the loss is logged as an error naming it.
func (s *Source) CopyHistory(ctx context.Context, pool *pgxpool.Pool, st *store.DeliveryStore, log *slog.Logger) (store.HistoryBatch, bool, error) {
	job, release, ok, err := store.TakeHistory(ctx, pool)
	if err != nil || !ok {
		return store.HistoryBatch{}, false, err
	}
	defer release()
	b := store.HistoryBatch{SubscriptionID: job.SubscriptionID}
	if wait := cmp.Or(s.Settle, RouteSettle) - time.Duration(job.AgeSeconds*float64(time.Second)); wait > 0 {
		return b, false, nil // the next round copies it
	}
	topics := s.topicsFor(job.Topic)
	cl, err := kgo.NewClient(s.Opts...)
	if err != nil {
		return b, false, err
	}
	ranges, err := Plan(ctx, kadm.NewClient(cl), topics, job.Since, nil)
	var re *RetentionError
	if errors.As(err, &re) && !re.Earliest.IsZero() {
		log.ErrorContext(ctx, "subscription history reaches past the topic's retention; copying from the earliest time still available",
			"subscription_id", job.SubscriptionID, "since", job.Since, "earliest", re.Earliest, "topic", re.Topic)
		ranges, err = Plan(ctx, kadm.NewClient(cl), topics, re.Earliest, nil)
	}
	cl.Close()
	if err != nil {
		return b, false, err
	}
	filter := contract.Filter{Enabled: true, EventTypes: job.EventTypes, Topic: job.Topic}
	var copied int64
	err = Read(ctx, s.Opts, ranges, func(recs []*kgo.Record) error {
		var f store.Fanout
		for _, r := range recs {
			b.Scanned++
			m, err := contract.DecodeWith(ctx, r, s.Values)
			if err != nil && !isDecodeError(err) {
				return err // the registry cannot answer: the next round copies again
			}
			if err != nil || !filter.Matches(r.Topic, m.EventType) {
				continue
			}
			f.AddEvent(store.Event{ID: m.DedupID, Type: m.EventType, Topic: r.Topic, AssetID: m.AssetID, AssetSeq: m.AssetSeq,
				Payload: string(m.Payload), CreatedAt: m.CreatedAt, Traceparent: m.Traceparent, Tracestate: m.Tracestate})
		}
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			n, err := store.InsertHistory(ctx, tx, job.SubscriptionID, &f)
			if err != nil {
				return err
			}
			copied += n
			return store.NoteHistoryProgress(ctx, tx, job.SubscriptionID, copied)
		})
	})
	if err != nil {
		return b, false, err
	}
	if err := st.FinishHistory(ctx, job.SubscriptionID, copied); err != nil {
		return b, false, err
	}
	b.Copied, b.Done = int(copied), true
	return b, true, nil
}
