package relay

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/outbox"
)

// BenchOptions configures Bench.
type BenchOptions struct {
	Events       int           // backlog drained (default 100000)
	Assets       int           // assets the backlog is spread over (default 1000)
	PayloadBytes int           // payload size (default 300)
	Partitions   int32         // partitions of the bench topic (default 6)
	Rate         int           // offered rate for the latency run, events/s (default 500)
	RateDuration time.Duration // length of the latency run (default 10s)
	Replicas     int           // relay replicas (default 1)
}

// BenchResult is what `bridge bench relay` prints.
type BenchResult struct {
	Events           int     `json:"events"`
	Assets           int     `json:"assets"`
	PayloadBytes     int     `json:"payload_bytes"`
	BatchSize        int     `json:"batch_size"`
	Replicas         int     `json:"replicas"`
	FillSeconds      float64 `json:"fill_seconds"`
	DrainSeconds     float64 `json:"drain_seconds"`
	DrainRate        float64 `json:"drain_events_per_second"`
	PeakHeapMiB      float64 `json:"peak_heap_mib"`
	BaselineHeapMiB  float64 `json:"baseline_heap_mib"`
	LatencyOffered   int     `json:"latency_offered_rate"`
	LatencyEvents    int     `json:"latency_events"`
	LatencyP50Ms     float64 `json:"latency_p50_ms"`
	LatencyP99Ms     float64 `json:"latency_p99_ms"`
	CeilingClaimMark float64 `json:"ceiling_postgres_claim_mark_rows_per_second"`
	CeilingProduce   float64 `json:"ceiling_kafka_produce_records_per_second"`
	// Verified is the number of backlog records read back from the topic;
	// OrderViolations counts keys whose asset-seq did not go 1, 2, 3, ...
	// (first copy of each dedup-id), which must be 0.
	Verified        int `json:"verified_records"`
	OrderViolations int `json:"order_violations"`
}

// Bench fills the outbox of pool (a scratch database) and measures the relay
// against the broker client talks to, next to the machine's ceilings measured
// in the same run with the same batch size: PostgreSQL claim+mark alone and
// Kafka produce alone.
func Bench(ctx context.Context, pool *pgxpool.Pool, kafkaOpts []kgo.Opt, cfg Config, o BenchOptions, progress func(string)) (*BenchResult, error) {
	cfg = cfg.withDefaults()
	o.Events = cmp.Or(o.Events, 100000)
	o.Assets = cmp.Or(o.Assets, 1000)
	o.PayloadBytes = cmp.Or(o.PayloadBytes, 300)
	o.Partitions = cmp.Or(o.Partitions, 6)
	o.Rate = cmp.Or(o.Rate, 500)
	o.RateDuration = cmp.Or(o.RateDuration, 10*time.Second)
	o.Replicas = cmp.Or(o.Replicas, 1)
	if progress == nil {
		progress = func(string) {}
	}
	res := &BenchResult{Events: o.Events, Assets: o.Assets, PayloadBytes: o.PayloadBytes, BatchSize: cfg.BatchSize, Replicas: o.Replicas}

	newClient := func() (*kgo.Client, error) {
		return kgo.NewClient(append(slices.Clone(kafkaOpts), ProducerOptions(cfg)...)...)
	}
	client, err := newClient()
	if err != nil {
		return nil, err
	}
	defer client.Close()
	topic := fmt.Sprintf("bridge-bench-%d", time.Now().UnixNano())
	adm := kadm.NewClient(client)
	if _, err := adm.CreateTopic(ctx, o.Partitions, -1, nil, topic); err != nil {
		return nil, fmt.Errorf("create bench topic: %w", err)
	}
	defer func() { _, _ = adm.DeleteTopics(context.WithoutCancel(ctx), topic) }()

	// Ceiling 1: Kafka produce alone, same client options and batch size.
	progress("measuring the Kafka produce ceiling")
	if res.CeilingProduce, err = produceCeiling(ctx, client, topic, min(o.Events, 200000), o.PayloadBytes, cfg.BatchSize); err != nil {
		return nil, err
	}

	// Ceiling 2: PostgreSQL claim+mark alone, same queries and batch size.
	progress("measuring the PostgreSQL claim+mark ceiling")
	if res.CeilingClaimMark, err = claimMarkCeiling(ctx, pool, cfg, min(o.Events, 200000), o.Assets, o.PayloadBytes); err != nil {
		return nil, err
	}

	// The backlog.
	progress(fmt.Sprintf("filling the outbox with %d events over %d assets", o.Events, o.Assets))
	start := time.Now()
	if _, err := pool.Exec(ctx, benchFillSQL, o.Events, topic, o.Assets, o.PayloadBytes); err != nil {
		return nil, fmt.Errorf("fill outbox: %w", err)
	}
	res.FillSeconds = time.Since(start).Seconds()
	if _, err := pool.Exec(ctx, `ANALYZE bridge.outbox`); err != nil {
		return nil, err
	}

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.BaselineHeapMiB = float64(ms.HeapInuse) / (1 << 20)
	var peak atomic.Uint64
	stopSampling := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-t.C:
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				if m.HeapInuse > peak.Load() {
					peak.Store(m.HeapInuse)
				}
			}
		}
	}()

	progress(fmt.Sprintf("draining with %d relay replica(s)", o.Replicas))
	runCtx, stopRelays := context.WithCancel(ctx)
	var relays sync.WaitGroup
	var clients []*kgo.Client
	start = time.Now()
	for i := range o.Replicas {
		c := client
		if i > 0 {
			if c, err = newClient(); err != nil {
				stopRelays()
				return nil, err
			}
			clients = append(clients, c)
		}
		rc := cfg
		rc.MemberID = ""
		r := New(pool, c, rc)
		relays.Add(1)
		go func() { defer relays.Done(); _ = r.Run(runCtx) }()
	}
	defer func() {
		stopRelays()
		relays.Wait()
		for _, c := range clients {
			c.Close()
		}
	}()
	if err := waitDrained(ctx, pool, topic); err != nil {
		return nil, err
	}
	res.DrainSeconds = time.Since(start).Seconds()
	res.DrainRate = float64(o.Events) / res.DrainSeconds
	close(stopSampling)
	sampler.Wait()
	res.PeakHeapMiB = float64(peak.Load()) / (1 << 20)

	progress("reading the topic back to verify per-key order")
	if res.Verified, res.OrderViolations, err = verifyOrder(ctx, kafkaOpts, topic, o.Events); err != nil {
		return nil, err
	}

	// Latency at a fixed offered rate: one event per committed transaction,
	// commit → broker ack (sent_at), relays running.
	progress(fmt.Sprintf("offering %d events/s for %s", o.Rate, o.RateDuration))
	res.LatencyOffered = o.Rate
	committed := map[uuid.UUID]time.Time{}
	interval := time.Second / time.Duration(o.Rate)
	next := time.Now()
	end := next.Add(o.RateDuration)
	for i := 0; time.Now().Before(end); i++ {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		next = next.Add(interval)
		var id uuid.UUID
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			id, err = outbox.Enqueue(ctx, tx, outbox.Event{Topic: topic, AssetID: fmt.Sprintf("bench-asset-%d", i%o.Assets), EventType: "bench.live", Payload: []byte(`{"live":true}`)})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("enqueue: %w", err)
		}
		committed[id] = time.Now()
	}
	if err := waitDrained(ctx, pool, topic); err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, 0, len(committed))
	for id := range committed {
		ids = append(ids, id)
	}
	lat, err := latencies(ctx, pool, ids, committed)
	if err != nil {
		return nil, err
	}
	res.LatencyEvents = len(lat)
	res.LatencyP50Ms = percentile(lat, 0.50)
	res.LatencyP99Ms = percentile(lat, 0.99)
	_, _ = pool.Exec(context.WithoutCancel(ctx), benchDeleteTopicSQL, topic)
	return res, nil
}

func waitDrained(ctx context.Context, pool *pgxpool.Pool, topic string) error {
	for {
		var n int64
		if err := pool.QueryRow(ctx, benchCountNewSQL, topic).Scan(&n); err != nil {
			return fmt.Errorf("count NEW rows: %w", err)
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func latencies(ctx context.Context, pool *pgxpool.Pool, ids []uuid.UUID, committed map[uuid.UUID]time.Time) ([]float64, error) {
	rows, err := pool.Query(ctx, benchLatencySQL, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []float64
	for rows.Next() {
		var id uuid.UUID
		var sent float64
		if err := rows.Scan(&id, &sent); err != nil {
			return nil, err
		}
		sentAt := time.Unix(0, int64(sent*1e9))
		out = append(out, float64(sentAt.Sub(committed[id]).Microseconds())/1000)
	}
	return out, rows.Err()
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func produceCeiling(ctx context.Context, client *kgo.Client, topic string, n, size, batch int) (float64, error) {
	value := []byte(`"` + string(make([]byte, 0)) + `"`)
	if size > 2 {
		buf := make([]byte, size)
		buf[0], buf[size-1] = '"', '"'
		for i := 1; i < size-1; i++ {
			buf[i] = 'x'
		}
		value = buf
	}
	// Warm up: the first record waits for the new topic's metadata, which is
	// not produce throughput.
	if err := client.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("warm-up"), Value: value}).FirstErr(); err != nil {
		return 0, fmt.Errorf("produce ceiling: %w", err)
	}
	start := time.Now()
	for sent := 0; sent < n; {
		k := min(batch, n-sent)
		var wg sync.WaitGroup
		var firstErr atomic.Value
		wg.Add(k)
		for i := range k {
			// The relay's own record shape (headers included), so the ceiling
			// is what the broker takes of the records the relay sends.
			asset := fmt.Sprintf("ceiling-%d", (sent+i)%1000)
			rec := contract.Encode(contract.Event{DedupID: uuid.NewString(), Topic: topic, AssetID: &asset,
				AssetSeq: int64(sent + i + 1), EventType: "bench.ceiling", Payload: value})
			client.Produce(ctx, rec, func(_ *kgo.Record, err error) {
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
				wg.Done()
			})
		}
		wg.Wait()
		if e := firstErr.Load(); e != nil {
			return 0, fmt.Errorf("produce ceiling: %w", e.(error))
		}
		sent += k
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// claimMarkCeiling measures what PostgreSQL allows for the relay's
// bookkeeping on this machine: claiming and marking batch-sized sets of NEW
// rows in seq order, one statement per batch, with no Kafka round trip and no
// lease or order checks in between (REFERENCE's "claim+mark in one
// statement"). The relay splits this into claim, produce and mark, and
// overlaps the mark with the next claim.
func claimMarkCeiling(ctx context.Context, pool *pgxpool.Pool, cfg Config, n, assets, size int) (float64, error) {
	topic := fmt.Sprintf("bridge-bench-ceiling-%d", time.Now().UnixNano())
	if _, err := pool.Exec(ctx, benchFillSQL, n, topic, assets, size); err != nil {
		return 0, fmt.Errorf("fill for ceiling: %w", err)
	}
	defer func() { _, _ = pool.Exec(context.WithoutCancel(ctx), benchDeleteTopicSQL, topic) }()
	if _, err := pool.Exec(ctx, `ANALYZE bridge.outbox`); err != nil {
		return 0, err
	}
	start := time.Now()
	done := int64(0)
	for done < int64(n) {
		tag, err := pool.Exec(ctx, benchClaimMarkSQL, topic, cfg.BatchSize)
		if err != nil {
			return 0, fmt.Errorf("claim+mark ceiling: %w", err)
		}
		if tag.RowsAffected() == 0 {
			break
		}
		done += tag.RowsAffected()
	}
	return float64(done) / time.Since(start).Seconds(), nil
}

// verifyOrder reads the topic from the start and checks that, per key, the
// first copy of each dedup-id carries asset-seq 1, 2, 3, ... in offset order.
func verifyOrder(ctx context.Context, kafkaOpts []kgo.Opt, topic string, want int) (read, violations int, err error) {
	cl, err := kgo.NewClient(append(slices.Clone(kafkaOpts), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	seen := map[string]bool{}
	next := map[string]int64{}
	bad := map[string]bool{}
	deadline, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for read < want {
		fs := cl.PollFetches(deadline)
		if deadline.Err() != nil {
			return read, len(bad), fmt.Errorf("read back %d of %d records: %w", read, want, deadline.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			m, err := contract.Decode(r)
			id := m.DedupID
			if seen[id] {
				return
			}
			seen[id] = true
			read++
			// Keys may not start at asset-seq 1 (earlier events of the asset),
			// but from the first one seen each must follow its predecessor.
			k := string(r.Key)
			var n int64
			if err == nil && m.AssetSeq != nil {
				n = *m.AssetSeq
			}
			if exp, ok := next[k]; ok && n != exp {
				bad[k] = true
			}
			next[k] = n + 1
		})
	}
	return read, len(bad), nil
}
