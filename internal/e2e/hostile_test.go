package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/e2e"
	"github.com/outboxbridge/bridge/internal/eventbounds"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/testkit"
	"github.com/outboxbridge/bridge/outbox"
)

// hostileText returns a random value of one hostile kind, n bytes or
// runes long: random base64 (incompressible), control characters, invalid
// UTF-8, a NUL, or a mix.
func hostileText(r *rand.Rand, n int) string {
	const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	var sb strings.Builder
	kind := r.IntN(5)
	for sb.Len() < n {
		switch kind {
		case 0:
			sb.WriteByte(b64[r.IntN(len(b64))])
		case 1:
			sb.WriteByte(byte(1 + r.IntN(31))) // control characters
		case 2:
			sb.WriteByte(0x80 + byte(r.IntN(64))) // continuation bytes alone: invalid UTF-8
		case 3:
			if sb.Len() == n/2 {
				sb.WriteByte(0)
			} else {
				sb.WriteByte('x')
			}
		default:
			sb.WriteString([]string{"é", "\u2028", "\x1b[31m", "a", "\xff"}[r.IntN(5)])
		}
	}
	return sb.String()[:n]
}

// lengthsAround are lengths at and past a bound, and far past it.
func lengthsAround(bound int) []int { return []int{bound, bound + 1, 2680, 3 * 1024} }

// Hostile values — lengths at and past every bound, control characters,
// invalid UTF-8, NUL, huge headers — go in through the application's API
// (outbox.Enqueue), SQL (bridge.enqueue) and a foreign Kafka producer, mixed
// with ordinary events, on the real services. Every ordinary event is
// delivered, in order per asset; each hostile one ends refused at entry,
// delivered (a value at its bound is a valid event), parked FAILED, or
// dead-lettered — never stuck. On both delivery paths: the fast lane (the
// default, decoding each record in memory) and the row engine's consumer.
// The seed is logged; BRIDGE_HOSTILE_SEED replays a run.
func TestHostileValuesNeverHoldBackOrdinaryEvents(t *testing.T) {
	t.Run("fast lane", func(t *testing.T) { testHostileValues(t, (*e2e.Pipeline).StartFastLane) })
	t.Run("row engine", func(t *testing.T) { testHostileValues(t, (*e2e.Pipeline).StartConsumerAndDeliverer) })
}

// testHostileValues is the test on one delivery path: start starts it.
func testHostileValues(t *testing.T, start func(*e2e.Pipeline)) {
	p := realPipeline(t, 2, false, e2e.Config{})
	kafkatest.CreateTopicNamed(t, p.Brokers, p.Topic+contract.DeadLetterSuffix, 1, nil)
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("BRIDGE_HOSTILE_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("seed %d (BRIDGE_HOSTILE_SEED=%d replays this run)", seed, seed)
	r := rand.New(rand.NewPCG(seed, seed))
	ctx := context.Background()
	start(p)
	p.StartRelay(0)
	producer := kafkatest.Client(t, p.Brokers)

	type fate struct {
		what    string
		id      string // outbox id or dedup id ("" when refused at entry)
		offset  int64  // foreign records: their offset (-1 otherwise)
		refused string
	}
	var hostile []fate
	var ordinary []string
	ordinaryN := 0
	writeOrdinary := func() {
		for _, a := range []string{"o1", "o2"} {
			ordinary = append(ordinary, p.Enqueue(ctx, a, fmt.Sprintf(`{"n":%d}`, ordinaryN)))
		}
		ordinaryN++
	}
	enqueue := func(what string, ev outbox.Event) {
		var id string
		err := pgx.BeginFunc(ctx, p.DB.Pool, func(tx pgx.Tx) error {
			u, err := outbox.Enqueue(ctx, tx, ev)
			id = u.String()
			return err
		})
		f := fate{what: what, offset: -1}
		var pe *pgconn.PgError
		switch {
		case err == nil:
			f.id = id
		case errors.Is(err, outbox.ErrInvalidEvent), errors.As(err, &pe) && strings.HasPrefix(pe.Code, "22"):
			f.refused = err.Error()
		default:
			t.Fatalf("%s: enqueue failed with %v, neither accepted nor refused for its input", what, err)
		}
		hostile = append(hostile, f)
	}
	base := func() outbox.Event {
		return outbox.Event{Topic: p.Topic, AssetID: "h", EventType: "asset.updated", Payload: json.RawMessage(`{}`)}
	}

	writeOrdinary()
	for _, n := range lengthsAround(eventbounds.MaxAssetID) {
		ev := base()
		ev.AssetID = hostileText(r, n)
		enqueue(fmt.Sprintf("outbox asset id of %d bytes", n), ev)
		writeOrdinary()
	}
	for _, n := range lengthsAround(eventbounds.MaxEventType) {
		ev := base()
		ev.EventType = hostileText(r, n)
		enqueue(fmt.Sprintf("outbox event type of %d bytes", n), ev)
		writeOrdinary()
	}
	for _, n := range []int{eventbounds.MaxHeaderValue, eventbounds.MaxHeaderValue + 1, 100_000} {
		ev := base()
		ev.Headers = map[string]string{hostileText(r, 20): hostileText(r, n)}
		enqueue(fmt.Sprintf("outbox header value of %d bytes", n), ev)
		writeOrdinary()
	}
	{
		ev := base()
		ev.Headers = map[string]string{strings.Repeat("n", eventbounds.MaxHeaderName+1): "v"}
		enqueue("outbox header name past its bound", ev)
		ev.Payload = json.RawMessage(`{"s":"\u0000"}`)
		ev.Headers = nil
		enqueue("outbox payload with a \\u0000 escape", ev)
		writeOrdinary()
	}
	// SQL, as another language calls it.
	for _, n := range lengthsAround(eventbounds.MaxAssetID) {
		var id string
		err := p.DB.Pool.QueryRow(ctx, `SELECT bridge.enqueue($1, $2, 'asset.updated', '{}')::text`, p.Topic, hostileText(r, n)).Scan(&id)
		f := fate{what: fmt.Sprintf("SQL asset id of %d bytes", n), offset: -1, id: id}
		var pe *pgconn.PgError
		if err != nil {
			if !errors.As(err, &pe) || !strings.HasPrefix(pe.Code, "22") {
				t.Fatalf("%s: %v, want accepted or refused with 22xxx", f.what, err)
			}
			f.id, f.refused = "", err.Error()
		}
		hostile = append(hostile, f)
		writeOrdinary()
	}
	// A foreign producer: keys, dedup ids and event types at and past their
	// bounds, hostile text, huge headers.
	foreign := func(what string, key []byte, dedup, eventType string, extra ...kgo.RecordHeader) {
		hs := []kgo.RecordHeader{{Key: contract.HeaderDedupID, Value: []byte(dedup)}, {Key: contract.HeaderEventType, Value: []byte(eventType)}}
		rec := &kgo.Record{Topic: p.Topic, Key: key, Value: []byte(`{"foreign":true}`), Headers: append(hs, extra...)}
		if err := producer.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatalf("%s: produce: %v", what, err)
		}
		hostile = append(hostile, fate{what: what, id: dedup, offset: rec.Offset})
		writeOrdinary()
	}
	for _, n := range lengthsAround(eventbounds.MaxAssetID) {
		foreign(fmt.Sprintf("foreign key of %d bytes", n), []byte(hostileText(r, n)), uuid.NewString(), "asset.updated")
	}
	for _, n := range lengthsAround(eventbounds.MaxDedupID) {
		foreign(fmt.Sprintf("foreign dedup id of %d bytes", n), []byte("f"), hostileText(r, n), "asset.updated")
	}
	for _, n := range lengthsAround(eventbounds.MaxEventType) {
		foreign(fmt.Sprintf("foreign event type of %d bytes", n), []byte("f"), uuid.NewString(), hostileText(r, n))
	}
	foreign("foreign record with 200 kB of headers", []byte("f"), uuid.NewString(), "asset.updated",
		kgo.RecordHeader{Key: "x-huge", Value: []byte(strings.Repeat("h", 200_000))})
	for range 5 {
		writeOrdinary()
	}

	// Every ordinary event, delivered in order per asset, within a minute.
	testkit.Eventually(t, 90*time.Second, func() string {
		missing := 0
		for _, id := range ordinary {
			if _, ok := p.Recv.Arrival("/hook", id); !ok {
				missing++
			}
		}
		return testkit.Unless(missing == 0, "%d of %d ordinary events not delivered", missing, len(ordinary))
	})
	if st := p.Recv.Stats(); st.OrderViolations != 0 || st.Duplicates != 0 || st.Overlaps != 0 {
		t.Errorf("receiver: %+v", st)
	}

	// Every hostile one has an end: refused, delivered, FAILED or
	// dead-lettered.
	var foreignN int
	for _, h := range hostile {
		if h.offset >= 0 {
			foreignN++
		}
	}
	dlq := map[string]string{} // "partition/offset" → reason
	testkit.Eventually(t, 60*time.Second, func() string {
		stuck := []string{}
		recs := kafkatest.ConsumeAll(t, p.Brokers, p.Topic+contract.DeadLetterSuffix, foreignN, 2*time.Second)
		for _, d := range recs {
			var part, off, reason string
			for _, h := range d.Headers {
				switch h.Key {
				case contract.HeaderDLQPartition:
					part = string(h.Value)
				case contract.HeaderDLQOffset:
					off = string(h.Value)
				case contract.HeaderDLQReason:
					reason = string(h.Value)
				}
			}
			_ = part
			dlq[off] = reason
		}
		for _, h := range hostile {
			switch {
			case h.refused != "":
			case h.offset >= 0:
				if _, ok := dlq[strconv.FormatInt(h.offset, 10)]; ok {
					continue
				}
				if _, ok := p.Recv.Arrival("/hook", h.id); ok {
					continue
				}
				stuck = append(stuck, h.what)
			default:
				if _, ok := p.Recv.Arrival("/hook", h.id); ok || p.OutboxStatus(h.id) == "FAILED" {
					continue
				}
				stuck = append(stuck, h.what+" ("+p.OutboxStatus(h.id)+")")
			}
		}
		return testkit.Unless(len(stuck) == 0, "hostile events with no end yet: %v", stuck)
	})
	for _, h := range hostile {
		t.Logf("%-40s refused=%v", h.what, h.refused != "")
	}
}
