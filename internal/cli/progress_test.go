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
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/keyring/keyringtest"
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
		"WEBHOOK_FAST_LANE":   "false",
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
	// Ready comes back with the first batch stored; the records may have
	// been polled in more than one batch: wait for all of them.
	var n int
	testkit.Eventually(t, 30*time.Second, func() string {
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries`).Scan(&n); err != nil {
			return err.Error()
		}
		return testkit.Unless(n >= 5, "%d deliveries after recovering", n)
	})
	if n != 5 {
		t.Errorf("%d deliveries after recovering, want 5", n)
	}
}

// SIGTERM to `bridge run` while a write to bridge.deliveries is retried (a
// transient error on every attempt): the process is done within 10 s, the
// time orchestrators give between SIGTERM and SIGKILL. On the row engine the
// consumer retries its batch; with the fast lane (the default) the fast lane
// retries handing the failing stream (the endpoint's address is refused) to
// the slow lane, and abandons it unsettled at shutdown.
func TestRunStopsWithinTenSecondsWhileTheConsumerRetries(t *testing.T) {
	for name, fastLane := range map[string]string{"row engine": "false", "fast lane": "true"} {
		t.Run(name, func(t *testing.T) { testRunStopsWhileAWriteRetries(t, fastLane) })
	}
}

func testRunStopsWhileAWriteRetries(t *testing.T, fastLane string) {
	db := pgtest.NewParallel(t)
	brokers := kafkatest.RealBrokers(t)
	topic := kafkatest.CreateTopic(t, brokers, 1, nil)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO bridge.subscriptions (url, event_types) VALUES ('https://example.com/hook', '{*}');
CREATE SEQUENCE public.fault_hits;
CREATE FUNCTION public.fault() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('public.fault_hits');
  RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001';
END $$;
CREATE TRIGGER fault AFTER INSERT ON bridge.deliveries FOR EACH STATEMENT EXECUTE FUNCTION public.fault();`); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(map[string]string{
		"DATABASE_URL":       db.URL,
		"KAFKA_BROKERS":      strings.Join(brokers, ","),
		"CONSUMER_TOPICS":    topic,
		"CONSUMER_GROUP":     "g-" + topic,
		"HTTP_ADDR":          "127.0.0.1:0",
		"BRIDGE_SECRET_KEYS": keyringtest.Keys,
		"WEBHOOK_FAST_LANE":  fastLane,
	}, config.Needs{Database: true, Kafka: true, Topics: true, Secrets: true})
	if err != nil {
		t.Fatal(err)
	}
	stages := withoutConsume(cfg, allStages)
	_, uses := needsOf(stages)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	rt, err := startRuntimeWith(runCtx, cfg, serviceAll, uses, runtimeOptions{
		getenv: func(string) string { return "" }, logger: logging.New(t.Output(), "warn", "text"),
		refresh: 100 * time.Millisecond, noGlobals: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- runBuilt(runCtx, cfg, rt, stages) }()
	if _, err := db.Pool.Exec(ctx, `SELECT bridge.enqueue($1, 'a', 'asset.updated', '{}') FROM generate_series(1, 5)`, topic); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, func() string {
		var n int64
		if err := db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT last_value FROM public.fault_hits WHERE is_called), 0)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return testkit.Unless(n >= 8, "%d failed attempts", n)
	})
	began := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not stop within 30s of SIGTERM")
	}
	rt.Close()
	t.Logf("stopped %s after SIGTERM", time.Since(began))
	if took := time.Since(began); took >= 10*time.Second {
		t.Errorf("bridge run took %s to stop while its write retried, want under 10s", took)
	}
}

// The deliverer's side of the same rule: deliveries are due and every claim
// fails (a serialization failure injected on the claim's update), so the
// deliverer is alive, connected and stuck; /readyz turns not ready within
// READY_STALL_TIMEOUT, naming what is due, and ready again once claims work.
func TestReadyzTurnsNotReadyWhenTheDelivererMakesNoProgressAndBackWhenItRecovers(t *testing.T) {
	db := pgtest.NewParallel(t)
	ctx := context.Background()
	var subID string
	if err := db.Pool.QueryRow(ctx, `INSERT INTO bridge.subscriptions (url, event_types) VALUES ('https://example.com/hook', '{*}') RETURNING id::text`).Scan(&subID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `
CREATE TABLE public.fault_on (on_ boolean);
INSERT INTO public.fault_on VALUES (true);
CREATE FUNCTION public.fault() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM public.fault_on) THEN
    RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER fault BEFORE UPDATE ON bridge.deliveries FOR EACH ROW EXECUTE FUNCTION public.fault();`); err != nil {
		t.Fatal(err)
	}
	var f store.Fanout
	for i := range 3 {
		idx := f.AddEvent(store.Event{ID: uuid.NewString(), Type: "asset.updated", Topic: "assets", Payload: fmt.Sprintf(`{"i":%d}`, i), CreatedAt: time.Now()})
		f.Deliver(idx, subID)
	}
	if err := store.Enqueue(ctx, db.Pool, &f); err != nil {
		t.Fatal(err)
	}

	const stall = 2 * time.Second
	cfg, err := config.Load(map[string]string{
		"DATABASE_URL":        db.URL,
		"HTTP_ADDR":           "127.0.0.1:0",
		"READY_STALL_TIMEOUT": stall.String(),
		"BRIDGE_SECRET_KEYS":  keyringtest.Keys,
		// The receiver does not exist: claims that work fail their attempt,
		// which is progress too.
		"WEBHOOK_RETRY_SCHEDULE": "1h",
		// The row engine's deliverer (the fast lane's has its own test).
		"WEBHOOK_FAST_LANE": "false",
	}, deliverStage.needs)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	rt, err := startRuntimeWith(runCtx, cfg, serviceDeliver, deliverStage.uses, runtimeOptions{
		getenv: func(string) string { return "" }, logger: logging.New(t.Output(), "warn", "text"),
		refresh: 100 * time.Millisecond, noGlobals: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- runBuilt(runCtx, cfg, rt, []stage{deliverStage}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("deliver: %v", err)
		}
		rt.Close()
	})
	began := time.Now()
	progressCheck := func() (opsserver.CheckResult, bool) {
		for _, c := range rt.Ops.Ready(ctx).Checks {
			if c.Name == "deliver_progress" {
				return c, true
			}
		}
		return opsserver.CheckResult{}, false
	}
	testkit.Eventually(t, 30*time.Second, func() string {
		c, ok := progressCheck()
		return testkit.Unless(ok && !c.OK, "deliver_progress still ok (present: %v)", ok)
	})
	if took := time.Since(began); took > stall+5*time.Second {
		t.Errorf("not ready %s after start, want within %s", took, stall)
	}
	if c, _ := progressCheck(); !strings.Contains(c.Error, "deliver made no progress for") || !strings.Contains(c.Error, "3 deliveries are due") {
		t.Errorf("deliver_progress error %q does not give the reason", c.Error)
	}
	if _, err := db.Pool.Exec(ctx, `DELETE FROM public.fault_on`); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() string {
		c, _ := progressCheck()
		return testkit.Unless(c.OK, "deliver_progress still failing after recovering: %s", c.Error)
	})
}

// The fast lane's side of the rule: its records wait (a stream's head
// failed, and every hand-over to the slow lane fails with a serialization
// failure injected on the insert into bridge.deliveries, which the lane
// rightly retries forever), so the lane is alive, connected and stuck;
// /readyz turns not ready within READY_STALL_TIMEOUT, naming how many
// records wait, and ready again once the hand-over goes through.
func TestReadyzTurnsNotReadyWhenTheFastLaneMakesNoProgressAndBackWhenItRecovers(t *testing.T) {
	db := pgtest.NewParallel(t)
	brokers := kafkatest.RealBrokers(t)
	topic := kafkatest.CreateTopic(t, brokers, 1, nil)
	ctx := context.Background()
	// The endpoint is loopback, which the SSRF guard refuses: every first
	// attempt fails at once and parks its stream.
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO bridge.subscriptions (url, event_types) VALUES ('http://127.0.0.1:9/hook', '{*}');
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
		"BRIDGE_SECRET_KEYS":  keyringtest.Keys,
		"WEBHOOK_FAST_LANE":   "true",
	}, deliverStage.needs)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	rt, err := startRuntimeWith(runCtx, cfg, serviceDeliver, deliverStage.uses, runtimeOptions{
		getenv: func(string) string { return "" }, logger: logging.New(t.Output(), "error", "text"),
		refresh: 100 * time.Millisecond, noGlobals: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- runBuilt(runCtx, cfg, rt, []stage{deliverStage}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("deliver: %v", err)
		}
		rt.Close()
	})
	progressCheck := func() (opsserver.CheckResult, bool) {
		for _, c := range rt.Ops.Ready(ctx).Checks {
			if c.Name == "fast_lane_progress" {
				return c, true
			}
		}
		return opsserver.CheckResult{}, false
	}
	// Idle (nothing to read): ready, however long it has been idle.
	testkit.Eventually(t, 30*time.Second, func() string {
		c, ok := progressCheck()
		if !ok {
			return "/readyz has no fast_lane_progress check yet"
		}
		return testkit.Unless(c.OK, "fast_lane_progress fails while idle: %s", c.Error)
	})

	producer := kafkatest.Client(t, brokers)
	for i := range 5 {
		asset := "a"
		r := contract.Encode(contract.Event{DedupID: uuid.NewString(), Topic: topic, AssetID: &asset, AssetSeq: int64(i + 1),
			EventType: "asset.updated", Payload: []byte(fmt.Sprintf(`{"i":%d}`, i)), CreatedAt: time.Now()})
		if err := producer.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produced := time.Now()
	testkit.Eventually(t, 60*time.Second, func() string {
		c, _ := progressCheck()
		return testkit.Unless(!c.OK, "fast_lane_progress still ok")
	})
	// Within the configured time, plus the group's join and first fetch and
	// the readiness cache.
	if took := time.Since(produced); took > stall+15*time.Second {
		t.Errorf("not ready %s after the records were produced, want within %s of the lane reading them", took, stall)
	}
	c, _ := progressCheck()
	if !strings.Contains(c.Error, "fast_lane made no progress for") || !strings.Contains(c.Error, "5 records of its partitions are not settled") {
		t.Errorf("fast_lane_progress error %q does not give the reason", c.Error)
	}
	if code, body := readyzOf(t, "http://"+rt.Ops.Addr()); code != 503 || body.OK() {
		t.Errorf("GET /readyz = %d %+v, want 503 not ready", code, body)
	}

	if _, err := db.Pool.Exec(ctx, `DELETE FROM public.fault_on`); err != nil {
		t.Fatal(err)
	}
	// The hand-over goes through: the five deliveries are rows of the slow
	// lane, and the lane is ready again.
	testkit.Eventually(t, 60*time.Second, func() string {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM bridge.deliveries`).Scan(&n); err != nil {
			return err.Error()
		}
		if n != 5 {
			return fmt.Sprintf("%d deliveries handed over, want 5", n)
		}
		c, _ := progressCheck()
		return testkit.Unless(c.OK, "fast_lane_progress still failing after recovering: %s", c.Error)
	})
}
