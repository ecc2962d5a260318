package judge

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// clean builds evidence of a perfect run: 3 assets plus the null asset, 4
// events each, two subscriptions, every request signed and answered 204 in
// stream order, one at a time.
func clean(t *testing.T) Evidence {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	ev := Evidence{
		Subscriptions: []Subscription{{Name: "a", Secret: secret}, {Name: "b", Secret: secret}},
		RolledBack:    []string{"rolled-back-1"},
		Kafka:         []KafkaRecord{},
		Outbox:        []OutboxRow{},
		Deliveries:    []Delivery{},
	}
	assets := []*string{ptr("x"), ptr("y"), ptr("z"), nil}
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	n := 0
	for ai, a := range assets {
		for seq := int64(1); seq <= 4; seq++ {
			n++
			id := fmt.Sprintf("ev-%02d", n)
			ev.Committed = append(ev.Committed, Committed{ID: id, AssetID: a, AssetSeq: seq})
			key := ""
			if a != nil {
				key = *a
			}
			ev.Kafka = append(ev.Kafka, KafkaRecord{Partition: int32(ai % 2), Offset: int64(n), Key: key, DedupID: id, AssetSeq: seq, ProducerID: 7})
			ev.Outbox = append(ev.Outbox, OutboxRow{ID: id, Status: "SENT"})
			body, _ := json.Marshal(map[string]any{"id": id, "type": "t", "asset_id": a, "asset_seq": seq, "data": map[string]int{"n": n}})
			for _, s := range ev.Subscriptions {
				ts := clock
				sig, err := wh.Sign(id, ts, body)
				if err != nil {
					t.Fatal(err)
				}
				ev.Receipts = append(ev.Receipts, Receipt{
					Subscription: s.Name, WebhookID: id, Timestamp: strconv.FormatInt(ts.Unix(), 10), Signature: sig,
					Body: body, Start: clock, End: clock.Add(5 * time.Millisecond), Status: 204,
				})
				ev.Deliveries = append(ev.Deliveries, Delivery{Subscription: s.Name, EventID: id, Status: "delivered"})
				clock = clock.Add(10 * time.Millisecond)
			}
		}
	}
	return ev
}

func ptr(s string) *string { return &s }

func TestCleanEvidencePasses(t *testing.T) {
	v := Judge(clean(t))
	if v.Broken() {
		t.Fatalf("clean run judged broken: %s", v.Summary())
	}
	if v.Committed != 16 || v.Receipts != 32 {
		t.Fatalf("counts: %s", v)
	}
}

// find returns the index of the receipt of event id to subscription sub.
func find(t *testing.T, ev Evidence, sub, id string) int {
	t.Helper()
	for i, r := range ev.Receipts {
		if r.Subscription == sub && r.WebhookID == id {
			return i
		}
	}
	t.Fatalf("no receipt %s/%s", sub, id)
	return -1
}

// The judge must catch each kind of doctored evidence.
func TestDoctoredEvidenceIsCaught(t *testing.T) {
	cases := []struct {
		name   string
		doctor func(t *testing.T, ev *Evidence)
		count  func(v Verdict) int
	}{
		{"a dropped success", func(t *testing.T, ev *Evidence) {
			i := find(t, *ev, "a", "ev-03")
			ev.Receipts = append(ev.Receipts[:i], ev.Receipts[i+1:]...)
		}, func(v Verdict) int { return v.Lost }},
		{"a success answered 500 instead", func(t *testing.T, ev *Evidence) {
			ev.Receipts[find(t, *ev, "b", "ev-07")].Status = 500
		}, func(v Verdict) int { return v.Lost }},
		{"two successes of one stream swapped", func(t *testing.T, ev *Evidence) {
			i, j := find(t, *ev, "a", "ev-02"), find(t, *ev, "a", "ev-03")
			// Swap what was sent, keep when: ev-03 now arrived first.
			ri, rj := ev.Receipts[i], ev.Receipts[j]
			ri.Start, rj.Start = rj.Start, ri.Start
			ri.End, rj.End = rj.End, ri.End
			ev.Receipts[i], ev.Receipts[j] = ri, rj
		}, func(v Verdict) int { return v.OrderViolations }},
		{"overlapping requests of one stream", func(t *testing.T, ev *Evidence) {
			i, j := find(t, *ev, "b", "ev-13"), find(t, *ev, "b", "ev-14") // the null-asset stream
			ev.Receipts[i].End = ev.Receipts[j].Start.Add(time.Millisecond)
		}, func(v Verdict) int { return v.TwoInFlight }},
		{"a bad signature", func(t *testing.T, ev *Evidence) {
			r := &ev.Receipts[find(t, *ev, "a", "ev-09")]
			sig := []byte(r.Signature)
			sig[len(sig)-2] ^= 1
			r.Signature = string(sig)
		}, func(v Verdict) int { return v.BadSignatures }},
		{"a body altered after signing", func(t *testing.T, ev *Evidence) {
			r := &ev.Receipts[find(t, *ev, "a", "ev-10")]
			r.Body = []byte(string(r.Body[:len(r.Body)-2]) + "9}")
		}, func(v Verdict) int { return v.BadSignatures }},
		{"a rolled-back event delivered", func(t *testing.T, ev *Evidence) {
			ev.Outbox = append(ev.Outbox, OutboxRow{ID: "rolled-back-1", Status: "SENT"})
		}, func(v Verdict) int { return v.RolledBackPublished }},
		{"a rolled-back event in the topic", func(t *testing.T, ev *Evidence) {
			ev.Kafka = append(ev.Kafka, KafkaRecord{Partition: 0, Offset: 99, Key: "x", DedupID: "rolled-back-1", AssetSeq: 9, ProducerID: 7})
		}, func(v Verdict) int { return v.RolledBackPublished }},
		{"one event delivered as two deliveries", func(t *testing.T, ev *Evidence) {
			ev.Deliveries = append(ev.Deliveries, Delivery{Subscription: "a", EventID: "ev-05", Status: "delivered"})
		}, func(v Verdict) int { return v.Duplicates }},
		{"a duplicate within one producer session", func(t *testing.T, ev *Evidence) {
			r := ev.Kafka[1]
			r.Offset = 1000
			ev.Kafka = append(ev.Kafka, r)
		}, func(v Verdict) int { return v.Duplicates }},
		{"a key reordered in the topic", func(t *testing.T, ev *Evidence) {
			ev.Kafka[0].Offset, ev.Kafka[1].Offset = ev.Kafka[1].Offset, ev.Kafka[0].Offset
		}, func(v Verdict) int { return v.OrderViolations }},
		{"an event missing from the topic", func(t *testing.T, ev *Evidence) {
			ev.Kafka = ev.Kafka[1:]
		}, func(v Verdict) int { return v.LostInKafka }},
		{"a FAILED outbox row", func(t *testing.T, ev *Evidence) {
			ev.Outbox[4].Status = "FAILED"
		}, func(v Verdict) int { return v.Failed }},
		{"a dead delivery", func(t *testing.T, ev *Evidence) {
			ev.Deliveries[6].Status = "dead"
		}, func(v Verdict) int { return v.Dead }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev := clean(t)
			tc.doctor(t, &ev)
			v := Judge(ev)
			if tc.count(v) == 0 || !v.Broken() {
				t.Fatalf("not caught: %s", v.Summary())
			}
			t.Logf("caught: %s", v.Summary())
		})
	}
}

// A redelivery after a crash (same webhook-id, same signed body) is at least
// once, not a duplicate; a copy of an event from a second producer session
// (a relay that died before marking) is not either.
func TestAllowedRepeats(t *testing.T) {
	ev := clean(t)
	i := find(t, ev, "a", "ev-04")
	again := ev.Receipts[i]
	again.Start = again.End.Add(time.Millisecond)
	again.End = again.Start.Add(time.Millisecond)
	ev.Receipts = append(ev.Receipts, again)
	r := ev.Kafka[2]
	r.Offset, r.ProducerID = 500, 8
	ev.Kafka = append(ev.Kafka, r)
	v := Judge(ev)
	if v.Broken() || v.Redeliveries != 1 {
		t.Fatalf("allowed repeats judged: %s", v.Summary())
	}
	// After a database restart or failover the same relay may produce a row
	// again (its SENT mark was lost): allowed when the run says so.
	ev = clean(t)
	again2 := ev.Kafka[3]
	again2.Offset = 600
	ev.Kafka = append(ev.Kafka, again2)
	if v := Judge(ev); !v.Broken() {
		t.Fatalf("a same-session copy must count as a duplicate by default: %s", v)
	}
	ev.SessionDuplicatesAllowed = true
	if v := Judge(ev); v.Broken() || v.Reproduced != 1 {
		t.Fatalf("a same-session copy after a lost mark: %s", v.Summary())
	}
}

// A successor's replay of a stream's suffix (the fast lane after a member
// died: events already acknowledged sent again, after a later one was
// acknowledged) breaks the order by default and is allowed, counted, with
// ReplaysAllowed; a first acknowledgment out of order is caught either way.
func TestReplayOfAcknowledgedEventsOnlyWhenAllowed(t *testing.T) {
	replay := func(t *testing.T) Evidence {
		ev := clean(t)
		i, j := find(t, ev, "a", "ev-02"), find(t, ev, "a", "ev-03")
		last := ev.Receipts[i].End
		for _, r := range ev.Receipts {
			if r.End.After(last) {
				last = r.End
			}
		}
		// ev-02 and ev-03 again, in order, after everything else.
		for n, k := range []int{i, j} {
			again := ev.Receipts[k]
			again.Start = last.Add(time.Duration(2*n+1) * time.Millisecond)
			again.End = again.Start.Add(time.Millisecond)
			ev.Receipts = append(ev.Receipts, again)
		}
		return ev
	}
	if v := Judge(replay(t)); v.OrderViolations == 0 {
		t.Fatalf("a replay must be an order violation unless allowed: %s", v.Summary())
	}
	ev := replay(t)
	ev.ReplaysAllowed = true
	if v := Judge(ev); v.Broken() || v.Replayed == 0 {
		t.Fatalf("an allowed replay judged: %s", v.Summary())
	}
	ev = clean(t)
	ev.ReplaysAllowed = true
	i, j := find(t, ev, "a", "ev-02"), find(t, ev, "a", "ev-03")
	ri, rj := ev.Receipts[i], ev.Receipts[j]
	ri.Start, rj.Start = rj.Start, ri.Start
	ri.End, rj.End = rj.End, ri.End
	ev.Receipts[i], ev.Receipts[j] = ri, rj
	if v := Judge(ev); v.OrderViolations == 0 {
		t.Fatalf("two first acknowledgments swapped must be caught with replays allowed: %s", v.Summary())
	}
}

// A copy of an event produced again after a lost SENT mark is posted again
// by the fast lane under the same webhook-id with the same body (its
// timestamp is the event's created-at, not the copy's record timestamp):
// counted apart from redeliveries when the topic holds the event twice, and
// allowed. A body that differs in anything, the timestamp included, is a
// duplicate, even when the run allows copies after a lost mark.
func TestReproducedCopyPostedAgain(t *testing.T) {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	build := func(t *testing.T, allowed, twoCopies bool, ts, data string) Evidence {
		ev := clean(t)
		ev.SessionDuplicatesAllowed = allowed
		i := find(t, ev, "a", "ev-04")
		sign := func(r *Receipt, ts, data string) {
			r.Body = []byte(`{"id":"ev-04","type":"t","asset_id":"x","asset_seq":4,"timestamp":"` + ts + `","data":` + data + `}`)
			at := time.Unix(0, 0)
			sig, err := wh.Sign(r.WebhookID, at, r.Body)
			if err != nil {
				t.Fatal(err)
			}
			r.Timestamp, r.Signature = "0", sig
		}
		sign(&ev.Receipts[i], "2026-01-01T00:00:00.1Z", `{"n":4}`)
		again := ev.Receipts[i]
		sign(&again, ts, data)
		again.Start = again.End.Add(time.Millisecond)
		again.End = again.Start.Add(time.Millisecond)
		ev.Receipts = append(ev.Receipts, again)
		if twoCopies {
			r := ev.Kafka[3]
			r.Offset, r.ProducerID = 700, 8 // another session: only the body is judged
			ev.Kafka = append(ev.Kafka, r)
		}
		return ev
	}
	const same = "2026-01-01T00:00:00.1Z"
	if v := Judge(build(t, true, true, same, `{"n":4}`)); v.Broken() || v.ReproducedBodies != 1 || v.Redeliveries != 0 {
		t.Fatalf("a re-produced copy posted again with the same body: %s", v.Summary())
	}
	if v := Judge(build(t, true, false, same, `{"n":4}`)); v.Broken() || v.ReproducedBodies != 0 || v.Redeliveries != 1 {
		t.Fatalf("the same request again, the topic holding the event once, is a redelivery: %s", v.Summary())
	}
	for _, tc := range []struct {
		name             string
		allowed, twoCopy bool
		ts, data         string
	}{
		{"the copy's own timestamp", true, true, "2026-01-01T00:00:05.2Z", `{"n":4}`},
		{"the copy's own timestamp, not allowed by the run", false, true, "2026-01-01T00:00:05.2Z", `{"n":4}`},
		{"the topic holds the event once", true, false, "2026-01-01T00:00:05.2Z", `{"n":4}`},
		{"the data differs", true, true, same, `{"n":5}`},
	} {
		if v := Judge(build(t, tc.allowed, tc.twoCopy, tc.ts, tc.data)); v.Duplicates == 0 || !v.Broken() {
			t.Errorf("%s: not caught as a duplicate: %s", tc.name, v.Summary())
		}
	}
}
