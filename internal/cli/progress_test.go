package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/logging"
	"github.com/outboxbridge/bridge/internal/opsserver"
	"github.com/outboxbridge/bridge/internal/pgtest"
	"github.com/outboxbridge/bridge/internal/testkit"
)

// A consumer that makes no progress while it holds records turns /readyz
// not ready within READY_STALL_TIMEOUT, with the reason in the check's
// error, and ready again once it recovers. The stall is a transient
// PostgreSQL error (a serialization failure injected on every delivery
// insert) that the consumer rightly retries forever: alive, connected to
// PostgreSQL and Kafka, and stuck.
func TestReadyzTurnsNotReadyWhenTheConsumerMakesNoProgressAndBackWhenItRecovers(t *testing.T) {
	db := pgtest.NewParallel(t)
	brokers := kafkatest.RealBrokers(t)
	topic := kafkatest.CreateTopic(t, brokers, 1, nil)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO bridge.subscriptions (url, event_types) VALUES ('https://example.com/hook', '{*}');
CREATE TABLE public.fault_on (on_ boolean);
INSERT INTO public.fault_on VALUES (true);
CREATE FUNCTION public.fault() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM public.fault_on) THEN
    RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001';
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER fault AFTER INSERT ON bridge.deliveries FOR EACH STATEMENT EXECUTE FUNCTION public.fault();`); err != nil {
		t.Fatal(err)
	}

	const stall = 2 * time.Second
	cfg, err := config.Load(map[string]string{
		"DATABASE_URL":        db.URL,
		"KAFKA_BROKERS":       strings.Join(brokers, ","),
		"CONSUMER_TOPICS":     topic,
		"CONSUMER_GROUP":      "g-" + topic,
		"HTTP_ADDR":           "127.0.0.1:0",
		"READY_STALL_TIMEOUT": stall.String(),
	}, consumeStage.needs)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	rt, err := startRuntimeWith(runCtx, cfg, serviceConsume, consumeStage.uses, runtimeOptions{
		getenv: func(string) string { return "" }, logger: logging.New(t.Output(), "warn", "text"),
		refresh: 100 * time.Millisecond, noGlobals: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- runBuilt(runCtx, cfg, rt, []stage{consumeStage}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consume: %v", err)
		}
		rt.Close()
	})
	progressCheck := func() (opsserver.CheckResult, bool) {
		for _, c := range rt.Ops.Ready(ctx).Checks {
			if c.Name == "consume_progress" {
				return c, true
			}
		}
		return opsserver.CheckResult{}, false
	}
	// Idle (nothing polled): ready, however long it has been idle.
	testkit.Eventually(t, 30*time.Second, func() string {
		if _, ok := progressCheck(); !ok {
			return "/readyz has no consume_progress check yet"
		}
		r := rt.Ops.Ready(ctx)
		return testkit.Unless(r.OK(), "not ready while idle: %+v", r.Checks)
	})

	producer := kafkatest.Client(t, brokers)
	for i := range 5 {
		r := &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte(fmt.Sprintf(`{"i":%d}`, i)), Headers: []kgo.RecordHeader{
			{Key: contract.HeaderDedupID, Value: []byte(uuid.NewString())},
			{Key: contract.HeaderEventType, Value: []byte("asset.updated")},
		}}
		if err := producer.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produced := time.Now()
	testkit.Eventually(t, 30*time.Second, func() string {
		c, _ := progressCheck()
		return testkit.Unless(!c.OK, "consume_progress still ok")
	})
	// Within the configured time (plus the consumer's first poll and the
	// readiness cache's second).
	if took := time.Since(produced); took > stall+5*time.Second {
		t.Errorf("not ready %s after the records were produced, want within %s", took, stall)
	}
	c, _ := progressCheck()
	if !strings.Contains(c.Error, "consume made no progress for") || !strings.Contains(c.Error, "polled records not stored yet") {
		t.Errorf("consume_progress error %q does not give the reason", c.Error)
	}
	if code, body := readyzOf(t, "http://"+rt.Ops.Addr()); code != 503 || body.OK() {
		t.Errorf("GET /readyz = %d %+v, want 503 not ready", code, body)
	}

	if _, err := db.Pool.Exec(ctx, `DELETE FROM public.fault_on`); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() string {
		r := rt.Ops.Ready(ctx)
		return testkit.Unless(r.OK(), "still not ready after recovering: %+v", r.Checks)
	})
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries`).Scan(&n); err != nil || n != 5 {
		t.Errorf("%d deliveries after recovering (%v), want 5", n, err)
	}
}
