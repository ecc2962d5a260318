// Package judge decides, from evidence gathered outside the pipeline, whether
// a fault run kept the bridge's promises. The evidence is what the
// application committed (its own table, written in the same transaction as
// each event), the ids of transactions it rolled back, every request the
// webhook receiver logged before answering, the topic read back independently
// of the bridge's consumer, and the outbox and deliveries tables. The judge
// trusts none of the pipeline's own bookkeeping: a delivery counts only when
// the receiver logged a 2xx for a request whose Standard Webhooks signature
// verifies with the subscription's secret (the official library).
//
// It is a package of its own, with no database or Kafka code, so it can be fed
// doctored evidence in unit tests: a judge that cannot fail proves nothing.
package judge

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// Committed is one event the application committed.
type Committed struct {
	ID       string
	AssetID  *string // nil: the null-asset stream
	AssetSeq int64
}

// Subscription is one webhook subscription; every committed event must reach
// each of them.
type Subscription struct {
	Name   string // what Receipt.Subscription says (the receiver's path)
	Secret string // whsec_…
}

// Receipt is one request the receiver logged (before answering it).
type Receipt struct {
	Subscription string
	WebhookID    string
	Timestamp    string
	Signature    string
	Body         []byte
	Start, End   time.Time // request arrived / answer decided
	Status       int       // what the receiver answered
}

// KafkaRecord is one record read back from the topic.
type KafkaRecord struct {
	Partition     int32
	Offset        int64
	Key           string
	DedupID       string
	AssetSeq      int64
	ProducerID    int64
	ProducerEpoch int16
}

// OutboxRow is an outbox row's id and status.
type OutboxRow struct {
	ID     string
	Status string
}

// Delivery is one row of the deliveries table.
type Delivery struct {
	Subscription string // same naming as Receipt.Subscription
	EventID      string
	Status       string
}

// Evidence is everything the judge looks at. Nil Kafka / Outbox / Deliveries
// slices are not checked (a judge of the receiver alone).
type Evidence struct {
	Committed     []Committed
	RolledBack    []string
	Subscriptions []Subscription
	Receipts      []Receipt
	Kafka         []KafkaRecord
	Outbox        []OutboxRow
	Deliveries    []Delivery
	// SessionDuplicatesAllowed: a copy of an event within one producer
	// session is expected in this run (the database lost a row's SENT mark
	// — a restart or a failover — so the same relay produced it again with
	// the same dedup-id) and counts as Reproduced, not as a duplicate. Runs
	// whose faults are all on the Kafka side leave it false: there the
	// idempotent producer must never write a record twice.
	SessionDuplicatesAllowed bool
	// ReplaysAllowed: a member that dies makes its successor read its
	// partitions again from the committed offset (the fast lane), so the
	// events it had sent and not yet committed past are sent again — a
	// suffix of a stream replayed in order, same webhook-ids and bodies. A
	// request for an event already acknowledged then counts as Replayed, not
	// as an order violation. An event acknowledged for the first time after a
	// later one of its stream still breaks the order.
	ReplaysAllowed bool
}

// Verdict is the judge's count of each kind of broken promise, plus figures.
type Verdict struct {
	Committed  int
	RolledBack int
	Receipts   int

	// Lost: (subscription, committed event) pairs with no verified 2xx at the
	// receiver; LostInKafka: committed events missing from the topic.
	Lost        int
	LostInKafka int
	// RolledBackPublished: rolled-back (or never committed) event ids found
	// in the topic, the outbox, the deliveries or the receiver's log.
	RolledBackPublished int
	// Duplicates: one event delivered as two different deliveries (two rows,
	// or two 2xx with different bodies), or produced twice within one
	// producer session (same producer id and epoch).
	Duplicates int
	// Redeliveries: the same signed request acknowledged again after a crash
	// (same webhook-id and body): at least once, allowed.
	Redeliveries int
	// Reproduced: records of an event produced again by one producer
	// session with the same dedup-id (allowed only with
	// SessionDuplicatesAllowed; the consumer's inbox drops them).
	Reproduced int
	// ReproducedBodies: an event acknowledged again under the same
	// webhook-id with the same body, the event being in the topic more than
	// once: the fast lane posts each copy it reads (it has no inbox), and
	// every copy carries the event's created-at, so the body is the same.
	// Allowed, counted apart from Redeliveries; a copy whose body differs in
	// anything, its timestamp included, is a duplicate.
	ReproducedBodies int
	// Replayed: requests for an event already acknowledged, made after a
	// later event of its stream was acknowledged (allowed only with
	// ReplaysAllowed).
	Replayed int
	// OrderViolations: a request for an event older than one already
	// acknowledged in its (subscription, asset) stream; or, in the topic, an
	// asset whose first copies are not in asset-seq order.
	OrderViolations int
	// TwoInFlight: requests of one (subscription, asset) stream that overlap.
	TwoInFlight int
	// BadSignatures: logged requests whose signature does not verify.
	BadSignatures int
	Failed        int // outbox rows FAILED
	Dead          int // deliveries dead
	NotSent       int // committed outbox rows still NEW

	// Examples of each problem (at most a few per kind), for the log.
	Problems []string
}

// Broken reports whether any promise was broken (the run fails). Dead and
// NotSent count too: each is also a lost delivery.
func (v Verdict) Broken() bool {
	return v.Lost+v.LostInKafka+v.RolledBackPublished+v.Duplicates+v.OrderViolations+
		v.TwoInFlight+v.BadSignatures+v.Failed+v.Dead+v.NotSent > 0
}

func (v Verdict) String() string {
	return fmt.Sprintf("committed %d, rolled back %d, receipts %d: lost %d (kafka %d), rolled-back published %d, "+
		"duplicates %d (redeliveries with the same id %d, re-produced %d, re-produced copy posted again %d, replayed %d), order violations %d, two-in-flight %d, bad signatures %d, "+
		"FAILED %d, dead %d, not sent %d",
		v.Committed, v.RolledBack, v.Receipts, v.Lost, v.LostInKafka, v.RolledBackPublished,
		v.Duplicates, v.Redeliveries, v.Reproduced, v.ReproducedBodies, v.Replayed, v.OrderViolations, v.TwoInFlight, v.BadSignatures,
		v.Failed, v.Dead, v.NotSent)
}

const maxExamples = 5

type counter struct {
	v    *Verdict
	seen map[string]int
}

func (c *counter) add(kind string, n *int, format string, args ...any) {
	*n++
	if c.seen[kind] < maxExamples {
		c.seen[kind]++
		c.v.Problems = append(c.v.Problems, kind+": "+fmt.Sprintf(format, args...))
	}
}

type envelope struct {
	ID       string  `json:"id"`
	AssetID  *string `json:"asset_id"`
	AssetSeq *int64  `json:"asset_seq"`
}

type streamKey struct{ sub, asset string }

func assetKey(a *string) string {
	if a == nil {
		return "\x00null"
	}
	return *a
}

// verified is a receipt whose signature checked out, with its envelope.
type verified struct {
	Receipt
	env envelope
}

// Judge weighs the evidence.
func Judge(ev Evidence) Verdict {
	v := Verdict{Committed: len(ev.Committed), RolledBack: len(ev.RolledBack), Receipts: len(ev.Receipts)}
	c := &counter{v: &v, seen: map[string]int{}}

	committed := make(map[string]Committed, len(ev.Committed))
	for _, e := range ev.Committed {
		committed[e.ID] = e
	}
	rolledBack := make(map[string]bool, len(ev.RolledBack))
	for _, id := range ev.RolledBack {
		rolledBack[id] = true
	}
	// notCommitted: published but not in the application's table.
	notCommitted := func(id, where string) {
		if _, ok := committed[id]; ok {
			return
		}
		what := "never committed"
		if rolledBack[id] {
			what = "rolled back"
		}
		c.add("rolled-back published", &v.RolledBackPublished, "%s event %s found in %s", what, id, where)
	}

	// Receipts: signatures first; nothing unverified counts as delivered.
	hooks := map[string]*standardwebhooks.Webhook{}
	for _, s := range ev.Subscriptions {
		wh, err := standardwebhooks.NewWebhook(s.Secret)
		if err == nil {
			hooks[s.Name] = wh
		}
	}
	var good []verified
	for _, r := range ev.Receipts {
		wh := hooks[r.Subscription]
		h := http.Header{}
		h.Set(standardwebhooks.HeaderWebhookID, r.WebhookID)
		h.Set(standardwebhooks.HeaderWebhookTimestamp, r.Timestamp)
		h.Set(standardwebhooks.HeaderWebhookSignature, r.Signature)
		if wh == nil {
			c.add("bad signature", &v.BadSignatures, "request %s to unknown subscription %q", r.WebhookID, r.Subscription)
			continue
		}
		// The receiver enforced the timestamp tolerance when it answered;
		// the judge runs later, so it checks the signature only.
		if err := wh.VerifyIgnoringTimestamp(r.Body, h); err != nil {
			c.add("bad signature", &v.BadSignatures, "request %s to %s: %v", r.WebhookID, r.Subscription, err)
			continue
		}
		var e envelope
		if err := json.Unmarshal(r.Body, &e); err != nil || e.ID == "" || e.AssetSeq == nil {
			c.add("bad signature", &v.BadSignatures, "request %s to %s: signed body is not an event envelope", r.WebhookID, r.Subscription)
			continue
		}
		if e.ID != r.WebhookID {
			c.add("duplicates", &v.Duplicates, "request webhook-id %s carries event %s", r.WebhookID, e.ID)
		}
		good = append(good, verified{Receipt: r, env: e})
	}
	sort.SliceStable(good, func(i, j int) bool { return good[i].Start.Before(good[j].Start) })

	copies := map[string]int{} // dedup id → records in the topic
	for _, r := range ev.Kafka {
		copies[r.DedupID]++
	}
	acked := map[streamKey]map[string][]byte{} // stream → event id → body of its first 2xx
	maxAcked := map[streamKey]int64{}
	lastEnd := map[streamKey]time.Time{}
	lastID := map[streamKey]string{}
	for _, r := range good {
		notCommitted(r.env.ID, "the receiver's log ("+r.Subscription+")")
		k := streamKey{r.Subscription, assetKey(r.env.AssetID)}
		seq := *r.env.AssetSeq
		if end, ok := lastEnd[k]; ok && r.Start.Before(end) {
			c.add("two-in-flight", &v.TwoInFlight, "stream %s/%s: request %s started %s before %s answered",
				k.sub, k.asset, r.WebhookID, end.Sub(r.Start), lastID[k])
		}
		if r.End.After(lastEnd[k]) {
			lastEnd[k], lastID[k] = r.End, r.WebhookID
		}
		_, ackedBefore := acked[k][r.env.ID]
		if m, ok := maxAcked[k]; ok && seq < m && ev.ReplaysAllowed && ackedBefore {
			v.Replayed++
		} else if ok && seq < m {
			c.add("order violations", &v.OrderViolations, "stream %s/%s: asset_seq %d (%s) requested after %d was acknowledged",
				k.sub, k.asset, seq, r.WebhookID, m)
		}
		if r.Status < 200 || r.Status > 299 {
			continue
		}
		if acked[k] == nil {
			acked[k] = map[string][]byte{}
		}
		if first, ok := acked[k][r.env.ID]; ok {
			switch {
			case string(first) == string(r.Body) && copies[r.env.ID] > 1:
				v.ReproducedBodies++
			case string(first) == string(r.Body):
				v.Redeliveries++
			default:
				c.add("duplicates", &v.Duplicates, "event %s acknowledged twice by %s with different bodies", r.env.ID, k.sub)
			}
			continue
		}
		acked[k][r.env.ID] = r.Body
		if seq > maxAcked[k] {
			maxAcked[k] = seq
		}
	}
	for _, s := range ev.Subscriptions {
		for _, e := range ev.Committed {
			k := streamKey{s.Name, assetKey(e.AssetID)}
			if _, ok := acked[k][e.ID]; !ok {
				c.add("lost", &v.Lost, "event %s (asset %s seq %d) never acknowledged by %s", e.ID, k.asset, e.AssetSeq, s.Name)
			}
		}
	}

	if ev.Kafka != nil {
		judgeKafka(ev, committed, notCommitted, c)
	}
	if ev.Outbox != nil {
		status := map[string]string{}
		for _, r := range ev.Outbox {
			status[r.ID] = r.Status
			notCommitted(r.ID, "the outbox")
			if r.Status == "FAILED" {
				c.add("FAILED", &v.Failed, "outbox row %s is FAILED", r.ID)
			}
		}
		for _, e := range ev.Committed {
			switch st, ok := status[e.ID]; {
			case !ok:
				// Retention may delete SENT rows; the topic check covers it.
			case st == "NEW":
				c.add("not sent", &v.NotSent, "outbox row %s still NEW", e.ID)
			}
		}
	}
	if ev.Deliveries != nil {
		rows := map[[2]string]int{}
		for _, d := range ev.Deliveries {
			notCommitted(d.EventID, "the deliveries table")
			rows[[2]string{d.Subscription, d.EventID}]++
			if d.Status == "dead" {
				c.add("dead", &v.Dead, "delivery of %s to %s is dead", d.EventID, d.Subscription)
			}
		}
		for k, n := range rows {
			if n > 1 {
				c.add("duplicates", &v.Duplicates, "%d delivery rows for event %s to %s", n, k[1], k[0])
			}
		}
	}
	return v
}

func judgeKafka(ev Evidence, committed map[string]Committed, notCommitted func(id, where string), c *counter) {
	v := c.v
	recs := append([]KafkaRecord(nil), ev.Kafka...)
	sort.SliceStable(recs, func(i, j int) bool {
		if recs[i].Partition != recs[j].Partition {
			return recs[i].Partition < recs[j].Partition
		}
		return recs[i].Offset < recs[j].Offset
	})
	seen := map[string]bool{}
	type session struct {
		pid   int64
		epoch int16
		id    string
	}
	inSession := map[session]bool{}
	lastSeq := map[string]int64{}
	partOf := map[string]int32{}
	for _, r := range recs {
		if p, ok := partOf[r.Key]; ok && p != r.Partition {
			c.add("order violations", &v.OrderViolations, "key %q in partitions %d and %d", r.Key, p, r.Partition)
		}
		partOf[r.Key] = r.Partition
		if r.ProducerID >= 0 {
			s := session{r.ProducerID, r.ProducerEpoch, r.DedupID}
			if inSession[s] {
				if ev.SessionDuplicatesAllowed {
					v.Reproduced++
				} else {
					c.add("duplicates", &v.Duplicates, "event %s produced twice by producer %d epoch %d", r.DedupID, r.ProducerID, r.ProducerEpoch)
				}
			}
			inSession[s] = true
		}
		if seen[r.DedupID] {
			continue // a copy from another producer session: the consumer's inbox drops it
		}
		seen[r.DedupID] = true
		notCommitted(r.DedupID, fmt.Sprintf("the topic (partition %d offset %d)", r.Partition, r.Offset))
		if last, ok := lastSeq[r.Key]; ok && r.AssetSeq <= last {
			c.add("order violations", &v.OrderViolations, "key %q: first copy of asset-seq %d at offset %d after %d",
				r.Key, r.AssetSeq, r.Offset, last)
		}
		if r.AssetSeq > lastSeq[r.Key] {
			lastSeq[r.Key] = r.AssetSeq
		}
	}
	for _, e := range ev.Committed {
		if !seen[e.ID] {
			c.add("lost in kafka", &v.LostInKafka, "event %s (asset %s seq %d) not in the topic", e.ID, assetKey(e.AssetID), e.AssetSeq)
		}
	}
	_ = committed
}

// Summary prints the verdict and its examples, one per line.
func (v Verdict) Summary() string {
	var b strings.Builder
	b.WriteString(v.String())
	for _, p := range v.Problems {
		b.WriteString("\n  ")
		b.WriteString(p)
	}
	return b.String()
}
