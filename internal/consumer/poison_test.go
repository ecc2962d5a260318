package consumer

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// randomText is n characters of base64 of random bytes: text PostgreSQL
// cannot compress, so its index entry is as long as the text.
func randomText(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)[:n]
}

// ordinary produces n relay-style events behind the hostile ones, on assets
// "a" and "b" alternately, and returns them in production order.
func (b *testBundle) ordinary(n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range n {
		asset := []string{"a", "b"}[i%2]
		recs[i] = b.record(asset, "asset.updated", int64(i/2+1), fmt.Sprintf(`{"i":%d}`, i))
	}
	return recs
}

// assertDeliveredInOrder checks that every record of want has exactly one
// delivery and that the deliveries' seq follows want's order.
func (b *testBundle) assertDeliveredInOrder(t *testing.T, want []*kgo.Record) {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT event_id FROM bridge.deliveries ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d deliveries, want %d", len(got), len(want))
	}
	for i, r := range want {
		id, _ := header(r, contract.HeaderDedupID)
		if got[i] != id {
			t.Fatalf("delivery %d is event %s, want %s (offset %d): order lost", i, got[i], id, r.Offset)
		}
	}
}

// deadLetters reads want records from the dead-letter topic, by source
// offset.
func (b *testBundle) deadLetters(t *testing.T, want int) map[int64]string {
	t.Helper()
	dead := kafkatest.ConsumeAll(t, b.brokers, b.topic+contract.DeadLetterSuffix, want, 60*time.Second)
	out := map[int64]string{}
	for _, d := range dead {
		off, _ := header(d, contract.HeaderDLQOffset)
		n, _ := strconv.ParseInt(off, 10, 64)
		out[n], _ = header(d, contract.HeaderDLQReason)
	}
	if len(out) != want {
		t.Fatalf("%d dead letters %v, want %d", len(out), out, want)
	}
	return out
}

// The records that jammed every partition: a relay-style event whose asset id
// is 2,680 characters (past deliveries_open_by_stream's btree limit) and a
// foreign record whose dedup-id header is 3 KB (consumer_inbox's key). Each
// goes to the dead-letter topic on its own, with the reason; the 60 ordinary
// events produced behind them are all delivered, in order.
func TestOverLongAssetIDAndDedupIDAreDeadLetteredAndTheEventsBehindThemFlow(t *testing.T) {
	t.Parallel()
	b := setup(t, kafkatest.RealBackend(), 1)
	b.createTopic(t, b.topic+contract.DeadLetterSuffix, 1)
	b.subscribe(t, []string{"*"}, nil, true)

	longAsset := b.record(randomText(2680), "asset.updated", 1, `{"long":"asset"}`)
	longDedup := b.record("c", "asset.updated", 1, `{"long":"dedup"}`)
	longDedup.Headers[0].Value = []byte(strings.Repeat("d", 3*1024))
	longDedup.Headers = longDedup.Headers[:2] // foreign: no asset-seq, no content-type
	first := b.record("a", "asset.updated", 0, `{"first":true}`)
	behind := b.ordinary(60)
	b.produce(t, append([]*kgo.Record{first, longAsset, longDedup}, behind...)...)

	c := b.newConsumer(t, nil)
	start(t, c)
	b.waitDeliveries(t, 61, 60*time.Second)
	b.assertDeliveredInOrder(t, append([]*kgo.Record{first}, behind...))

	reasons := b.deadLetters(t, 2)
	if r := reasons[longAsset.Offset]; r != "key (the asset id) is 2680 bytes long; at most 512 are allowed" {
		t.Errorf("long asset id: dlq-reason %q", r)
	}
	if r := reasons[longDedup.Offset]; r != "header dedup-id is 3072 bytes long; at most 512 are allowed" {
		t.Errorf("long dedup id: dlq-reason %q", r)
	}
	testkit.Eventually(t, 30*time.Second, func() string {
		off := b.committed(t)
		return testkit.Unless(off[0] == int64(63), "committed %v, want 63", off)
	})
}

// What Decode's bounds stop first, PostgreSQL refuses too: with the bound
// lifted (the parse hook), the 2,680-character asset id reaches the database
// and fails the batch with 54000, as it did before there were bounds. The
// batch is split until that record — and two more PostgreSQL refuses, a
// \u0000 in jsonb (22P05) and a number past numeric's range (22003) — are
// alone; they are dead-lettered with PostgreSQL's reason and the 60 ordinary
// events around them are stored in order, in one pass.
func TestBatchIsSplitUntilTheRecordsPostgreSQLRefusesAreAlone(t *testing.T) {
	t.Parallel()
	b := setup(t, kafkatest.RealBackend(), 1)
	b.createTopic(t, b.topic+contract.DeadLetterSuffix, 1)
	b.subscribe(t, []string{"*"}, nil, true)

	all := b.ordinary(60)
	longAsset := b.record(randomText(2680), "asset.updated", 1, `{}`)
	nul := b.record("a", "asset.updated", 100, `{"s":"\u0000"}`)
	huge := b.record("b", "asset.updated", 100, `{"n":1e1000000}`)
	recs := append([]*kgo.Record{}, all[:5]...)
	recs = append(recs, longAsset)
	recs = append(recs, all[5:30]...)
	recs = append(recs, nul)
	recs = append(recs, all[30:41]...)
	recs = append(recs, huge)
	recs = append(recs, all[41:]...)
	b.produce(t, recs...)

	c := b.newConsumer(t, nil)
	c.parse = func(r *kgo.Record) *event {
		cp := *r
		cp.Key = nil
		ev, _ := parse(context.Background(), &cp, nil)
		ev.rec = r
		if len(r.Key) > 0 {
			k := string(r.Key)
			ev.assetID = &k
		}
		return ev
	}
	start(t, c)
	b.waitDeliveries(t, 60, 60*time.Second)
	reasons := b.deadLetters(t, 3)
	b.assertDeliveredInOrder(t, all)
	for rec, code := range map[*kgo.Record]string{longAsset: "54000", nul: "22P05", huge: "22003"} {
		r := reasons[rec.Offset]
		if !strings.HasPrefix(r, "PostgreSQL rejected the record: ") || !strings.Contains(r, "(SQLSTATE "+code+")") {
			t.Errorf("offset %d: dlq-reason %q, want PostgreSQL's SQLSTATE %s", rec.Offset, r, code)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM bridge.consumer_inbox`); n != 60 {
		t.Errorf("inbox rows = %d, want 60 (dead letters never enter the inbox)", n)
	}
}

// A transient error — PostgreSQL's serialization failure, deadlock, admin
// shutdown or connection failure, injected by a trigger — retries the whole
// batch and dead-letters nothing: once it clears, every event is delivered,
// in order. The same trigger raising a data exception for one record
// instead dead-letters just that record.
func TestTransientErrorsRetryTheWholeBatchAndDeadLetterNothing(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"40001", "40P01", "57P01", "08006"} {
		t.Run(code, func(t *testing.T) {
			t.Parallel()
			b := setup(t, kafkatest.RealBackend(), 1)
			b.createTopic(t, b.topic+contract.DeadLetterSuffix, 1)
			b.subscribe(t, []string{"*"}, nil, true)
			ctx := context.Background()
			if _, err := b.db.Pool.Exec(ctx, fmt.Sprintf(`
CREATE TABLE public.fault_on (on_ boolean);
INSERT INTO public.fault_on VALUES (true);
CREATE SEQUENCE public.fault_hits;
CREATE FUNCTION public.fault() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM public.fault_on) THEN
    PERFORM nextval('public.fault_hits');
    RAISE EXCEPTION 'injected fault' USING ERRCODE = '%s';
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER fault AFTER INSERT ON bridge.deliveries FOR EACH STATEMENT EXECUTE FUNCTION public.fault();`, code)); err != nil {
				t.Fatal(err)
			}
			recs := b.ordinary(20)
			b.produce(t, recs...)
			c := b.newConsumer(t, nil)
			start(t, c)
			testkit.Eventually(t, 60*time.Second, func() string {
				n := b.count(t, `SELECT coalesce((SELECT last_value FROM public.fault_hits WHERE is_called), 0)::int`)
				return testkit.Unless(n >= 3, "%d failed attempts", n)
			})
			if _, err := b.db.Pool.Exec(ctx, `DELETE FROM public.fault_on`); err != nil {
				t.Fatal(err)
			}
			b.waitDeliveries(t, 20, 60*time.Second)
			b.assertDeliveredInOrder(t, recs)
			if s := c.Stats(); s.DeadLettered != 0 {
				t.Errorf("%d dead-lettered on a transient error", s.DeadLettered)
			}
		})
	}
}

// A consumer retrying a batch through a transient error (here a
// serialization failure on every attempt) stops within 10 s of being told
// to: the batch is abandoned uncommitted, to be redelivered.
func TestShutdownWhileRetryingABatchTakesUnderTenSeconds(t *testing.T) {
	t.Parallel()
	b := setup(t, kafkatest.RealBackend(), 1)
	b.subscribe(t, []string{"*"}, nil, true)
	if _, err := b.db.Pool.Exec(context.Background(), `
CREATE SEQUENCE public.fault_hits;
CREATE FUNCTION public.fault() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('public.fault_hits');
  RAISE EXCEPTION 'injected fault' USING ERRCODE = '40001';
END $$;
CREATE TRIGGER fault AFTER INSERT ON bridge.deliveries FOR EACH STATEMENT EXECUTE FUNCTION public.fault();`); err != nil {
		t.Fatal(err)
	}
	b.produce(t, b.ordinary(5)...)
	c := b.newConsumer(t, func(cfg *Config) { cfg.RetryBackoff = 0 }) // the default backoff, up to 5s
	stop, _ := start(t, c)
	testkit.Eventually(t, 60*time.Second, func() string {
		n := b.count(t, `SELECT coalesce((SELECT last_value FROM public.fault_hits WHERE is_called), 0)::int`)
		return testkit.Unless(n >= 5, "%d failed attempts", n)
	})
	began := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took >= 10*time.Second {
		t.Errorf("shutdown took %s while retrying a batch, want under 10s", took)
	}
	if n := b.deliveries(t); n != 0 {
		t.Errorf("%d deliveries from an abandoned batch", n)
	}
}
