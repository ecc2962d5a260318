package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/chaos/judge"
	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/kafkaclient"
	"github.com/outboxbridge/bridge/internal/keyring/keyringtest"
	"github.com/outboxbridge/bridge/internal/service"
)

// Pipeline is one fault run's world: a database, brokers, the bridge
// processes, the receiver, the application writing events, and a sampler
// watching from outside.
type Pipeline struct {
	T        testing.TB
	Dir      string
	Bin      string
	DBURL    string // what the bridge processes get (may name several hosts)
	AppURL   string // what the application and the judge use
	Brokers  []string
	Topic    string
	Parts    int32    // the topic's partitions
	Subs     []string // subscription names (receiver paths)
	Secrets  map[string]string
	Receiver *Receiver
	Procs    []*Proc
	Env      []string

	appPool *pgxpool.Pool

	mu         sync.Mutex
	rolledBack []string
	ackedTx    []string // ids of transactions whose COMMIT returned success
	drainedAt  time.Time
	drainFrom  time.Time
	txOK       atomic.Int64
	txErr      atomic.Int64
	events     []Event // what happened when (kills, outages), for the report
	samples    []sample
}

// Event is one thing the run did to the pipeline.
type Event struct {
	At   time.Time
	What string
	Pid  int
	Kind string
	End  time.Time // outages: when it ended
}

// PipelineConfig says what to run.
type PipelineConfig struct {
	DBURL, AppURL string
	Brokers       []string
	Partitions    int32
	Replication   int16
	Subs          []string       // default a, b, flaky
	FailFirst     map[string]int // default flaky: 2
	Procs         map[string]int // kind → count; default relay 2, consume 2, deliver 2, run 1
	ExtraEnv      []string
	TopicConfigs  map[string]*string
}

// NewPipeline migrates the database, creates the topic and subscriptions,
// and starts the receiver (not yet the bridge processes).
func NewPipeline(t testing.TB, cfg PipelineConfig) *Pipeline {
	t.Helper()
	if cfg.Subs == nil {
		cfg.Subs = []string{"a", "b", "flaky"}
		if cfg.FailFirst == nil {
			cfg.FailFirst = map[string]int{"flaky": 2}
		}
	}
	if cfg.Procs == nil {
		cfg.Procs = map[string]int{"relay": 2, "consume": 2, "deliver": 2, "run": 1}
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = 6
	}
	if cfg.Replication == 0 {
		cfg.Replication = 1
	}
	if cfg.AppURL == "" {
		cfg.AppURL = cfg.DBURL
	}
	// Kept when the test fails (process logs, the receiver's log).
	dir, err := os.MkdirTemp("", "chaos-run-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			_ = os.RemoveAll(dir)
		}
	})
	p := &Pipeline{T: t, Dir: dir, Bin: BridgeBinary(t), DBURL: cfg.DBURL, AppURL: cfg.AppURL, Brokers: cfg.Brokers,
		Topic: fmt.Sprintf("chaos.assets.%d", time.Now().UnixNano()%1e9), Parts: cfg.Partitions, Subs: cfg.Subs, Secrets: map[string]string{}}
	t.Logf("run directory (process logs, receiver log): %s", dir)

	rcv, err := NewReceiver(filepath.Join(dir, "receiver.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range cfg.FailFirst {
		rcv.FailFirst[k] = v
	}
	p.Receiver = rcv
	t.Cleanup(rcv.Close)

	p.Env = append([]string{
		"DATABASE_URL=" + cfg.DBURL,
		"KAFKA_BROKERS=" + strings.Join(cfg.Brokers, ","),
		"CONSUMER_TOPICS=" + p.Topic,
		"CONSUMER_GROUP=chaos-" + p.Topic,
		"HTTP_ADDR=off",
		"LOG_LEVEL=info",
		"LOG_FORMAT=json",
		"RELAY_LEASE_TIMEOUT=" + RelayLease.String(),
		"RELAY_POLL_INTERVAL=200ms",
		"RELAY_PRODUCE_TIMEOUT=5s",
		"WEBHOOK_ALLOW_HTTP=true",
		"WEBHOOK_ALLOWED_CIDRS=127.0.0.0/8",
		// Long enough to ride out a 20 s broker or receiver outage on top of
		// the flaky subscription's failures: nothing should die.
		"WEBHOOK_RETRY_SCHEDULE=0s,200ms,500ms,1s,2s,3s,5s,5s,5s,10s,10s,10s,10s,10s,15s,15s",
		"WEBHOOK_LEASE=5s",
		"WEBHOOK_TIMEOUT=3s",
		"WEBHOOK_POLL_INTERVAL=200ms",
		"WEBHOOK_SHUTDOWN_GRACE=1s",
		"WEBHOOK_DISABLE_AFTER=1000",
		// The flaky subscription needs three sequential attempts per event;
		// with the default 8 requests in flight per subscription it drains
		// about 30 events/s here, below the long load's rate.
		"WEBHOOK_MAX_IN_FLIGHT_PER_SUBSCRIPTION=32",
		"WEBHOOK_WORKERS=64",
		// The consumer group runs with the product's defaults
		// (CONSUMER_SESSION_TIMEOUT, CONSUMER_REBALANCE_TIMEOUT): the stall
		// bound is a promise about them. groupEnv passes an override from
		// the test's own environment, to measure another setting.
		// DATABASE_CONNECT_TIMEOUT is left at its default (3 m), longer than
		// a broker outage plus brokerRestartWait: a process restarted during
		// an outage waits for the dependency the test is bringing back.
		// Signing secrets sealed as in production (and opened by every
		// deliverer across its restarts).
		"BRIDGE_SECRET_KEYS=" + keyringtest.Keys,
		// The row engine (`bridge consume` fanning out into
		// bridge.deliveries) unless the test's ExtraEnv turns the fast lane
		// on; the later setting wins.
		"WEBHOOK_FAST_LANE=false",
	}, append(groupEnv(), cfg.ExtraEnv...)...)

	if out, err := p.Cmd("migrate").CombinedOutput(); err != nil {
		t.Fatalf("bridge migrate: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, cfg.AppURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	p.appPool = pool
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS app;
		CREATE TABLE IF NOT EXISTS app.committed (id uuid PRIMARY KEY, asset_id text, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	if err := createTopic(ctx, cfg.Brokers, p.Topic, cfg.Partitions, cfg.Replication, cfg.TopicConfigs); err != nil {
		t.Fatal(err)
	}
	for _, s := range cfg.Subs {
		out, err := p.Cmd("subscriptions", "create", "--url", rcv.URL(s), "--event-types", "*", "-o", "json").Output()
		if err != nil {
			t.Fatalf("subscriptions create: %v\n%s", err, out)
		}
		var sub struct {
			Secret string `json:"secret"`
		}
		if err := json.Unmarshal(out, &sub); err != nil || sub.Secret == "" {
			t.Fatalf("subscriptions create output %q: %v", out, err)
		}
		p.Secrets[s] = sub.Secret
		if err := rcv.SetSecret(s, sub.Secret); err != nil {
			t.Fatal(err)
		}
	}
	kinds := make([]string, 0, len(cfg.Procs))
	for k := range cfg.Procs {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, kind := range kinds {
		for i := 1; i <= cfg.Procs[kind]; i++ {
			p.Procs = append(p.Procs, NewProc(p.Bin, dir, fmt.Sprintf("%s-%d", kind, i), kind, p.Env, kind))
		}
	}
	return p
}

// groupEnv is the CONSUMER_SESSION_TIMEOUT / CONSUMER_REBALANCE_TIMEOUT of
// the test process's environment, when set (e.g.
// `CONSUMER_SESSION_TIMEOUT=8s go test -run Stall ./internal/chaos/`).
func groupEnv() []string {
	var out []string
	for _, k := range []string{"CONSUMER_SESSION_TIMEOUT", "CONSUMER_REBALANCE_TIMEOUT"} {
		if v, ok := os.LookupEnv(k); ok {
			out = append(out, k+"="+v)
		}
	}
	return out
}

// RelayLease is the relays' RELAY_LEASE_TIMEOUT in fault runs.
const RelayLease = 3 * time.Second

// Cmd is a one-shot bridge command with the run's environment.
func (p *Pipeline) Cmd(args ...string) *exec.Cmd {
	c := exec.Command(p.Bin, args...)
	c.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, p.Env...)
	return c
}

func createTopic(ctx context.Context, brokers []string, topic string, parts int32, rf int16, configs map[string]*string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	resp, err := adm.CreateTopic(ctx, parts, rf, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	if kafkaclient.WaitTopicReady(ctx, adm, topic, int(parts), int(rf)) != nil {
		return fmt.Errorf("topic %s never became ready", topic)
	}
	return nil
}

// StartProcs starts every bridge process.
func (p *Pipeline) StartProcs() {
	for _, pr := range p.Procs {
		if err := pr.Start(); err != nil {
			p.T.Fatalf("start %s: %v", pr.Name, err)
		}
	}
	p.T.Cleanup(func() { p.StopProcs() })
}

// StopProcs SIGTERMs every process (in parallel) and waits.
func (p *Pipeline) StopProcs() {
	var wg sync.WaitGroup
	for _, pr := range p.Procs {
		wg.Add(1)
		go func() { defer wg.Done(); pr.Stop(10 * time.Second) }()
	}
	wg.Wait()
}

// WaitSettled waits until the pipeline is up before faults begin: every
// relay lane has a live owner, and the consumer group is stable with one
// member per consuming process, each assigned partitions. Otherwise a kill
// in the first seconds hits a process that holds nothing yet (a relay
// killed before it took a lane measured no takeover).
func (p *Pipeline) WaitSettled(timeout time.Duration) {
	p.T.Helper()
	consumers, relays := 0, 0
	for _, pr := range p.Procs {
		switch pr.Kind {
		case "consume":
			consumers++
		case "relay":
			relays++
		case "run":
			consumers++
			relays++
		}
	}
	g, err := p.Group()
	if err != nil {
		p.T.Fatal(err)
	}
	defer g.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var unowned int
		err := p.appPool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE owner IS NULL OR expires_at < now()) + (count(*) = 0)::int FROM bridge.relay_lanes`).Scan(&unowned)
		lanesOK := relays == 0 || (err == nil && unowned == 0)
		m, gerr := g.Members(ctx)
		cancel()
		groupOK := consumers == 0 || (gerr == nil && len(m) == consumers)
		for _, n := range m {
			groupOK = groupOK && n > 0
		}
		if lanesOK && groupOK {
			return
		}
		if time.Now().After(deadline) {
			p.T.Fatalf("pipeline not settled within %s: lanes without a live owner %d (%v); group members %v (%v), want %d",
				timeout, unowned, err, m, gerr, consumers)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// LaneCounts returns, per pid, how many relay lanes it held at the last
// sample.
func (p *Pipeline) LaneCounts() map[int]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[int]int{}
	for i := len(p.samples) - 1; i >= 0; i-- {
		if len(p.samples[i].Owners) == 0 {
			continue
		}
		for _, pr := range p.Procs {
			mark := fmt.Sprintf("/%d/", pr.Pid())
			for _, o := range p.samples[i].Owners {
				if strings.Contains(o, mark) {
					out[pr.Pid()]++
				}
			}
		}
		break
	}
	return out
}

// LastFaultEnd is when the last outage the run noted ended (zero: none).
func (p *Pipeline) LastFaultEnd() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var last time.Time
	for _, e := range p.events {
		if e.End.After(last) {
			last = e.End
		}
	}
	return last
}

// DrainedAt is the first drained moment WatchDrain saw (zero: not yet).
func (p *Pipeline) DrainedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drainedAt
}

// Note records something the run did.
func (p *Pipeline) Note(e Event) {
	p.mu.Lock()
	p.events = append(p.events, e)
	p.mu.Unlock()
	p.T.Logf("%s %s %s", e.At.Format("15:04:05.000"), e.What, e.Kind)
}

// Events returns what the run did.
func (p *Pipeline) Events() []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Event(nil), p.events...)
}

// Kill SIGKILLs proc, records it and returns the pid it killed.
func (p *Pipeline) Kill(pr *Proc) int {
	pid := pr.Kill()
	p.Note(Event{At: time.Now(), What: "SIGKILL " + pr.Name, Pid: pid, Kind: pr.Kind})
	return pid
}

// KillAndHold SIGKILLs proc, keeps it down until its Resume, and records it.
func (p *Pipeline) KillAndHold(pr *Proc) int {
	pid := pr.KillAndHold()
	p.Note(Event{At: time.Now(), What: "SIGKILL " + pr.Name + " (held down)", Pid: pid, Kind: pr.Kind})
	return pid
}

// Load writes transactions at rate tx/s until ctx ends: each one enqueues
// 1–3 events of one asset (of 200, or the null asset) and records their ids
// in app.committed in the same transaction; one in ten rolls back instead
// (its ids are remembered: none may ever be published).
func (p *Pipeline) Load(ctx context.Context, rate int) {
	var wg sync.WaitGroup
	workers := 8
	tick := time.Duration(float64(time.Second) * float64(workers) / float64(rate))
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			service.Every(ctx, service.Loop{Name: "chaos load", Interval: tick}, func(ctx context.Context) error {
				p.oneTx(ctx, rng)
				return nil
			})
		}(w)
	}
	wg.Wait()
}

func (p *Pipeline) oneTx(ctx context.Context, rng *rand.Rand) {
	var asset *string
	// One transaction in 200 writes the null asset: it is one stream, so
	// with the flaky subscription (three attempts per event, one at a time)
	// it drains at about one event per second by design, and a larger share
	// would make the drain measure that stream alone.
	if rng.IntN(200) != 0 {
		a := fmt.Sprintf("asset-%03d", rng.IntN(200))
		asset = &a
	}
	n := 1 + rng.IntN(3)
	rollback := rng.IntN(10) == 0
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := p.appPool.Begin(tctx)
	if err != nil {
		p.txErr.Add(1)
		return
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck
	var ids []string
	for i := 0; i < n; i++ {
		var id string
		payload := fmt.Sprintf(`{"n":%d,"rollback":%t}`, i, rollback)
		if err := tx.QueryRow(tctx, `SELECT bridge.enqueue($1, $2, 'asset.changed', $3::jsonb)::text`, p.Topic, asset, payload).Scan(&id); err != nil {
			p.txErr.Add(1)
			return
		}
		if _, err := tx.Exec(tctx, `INSERT INTO app.committed (id, asset_id) VALUES ($1, $2)`, id, asset); err != nil {
			p.txErr.Add(1)
			return
		}
		ids = append(ids, id)
	}
	if rollback {
		if err := tx.Rollback(tctx); err == nil {
			p.mu.Lock()
			p.rolledBack = append(p.rolledBack, ids...)
			p.mu.Unlock()
		} else {
			// Never committed either way: COMMIT was not sent.
			p.mu.Lock()
			p.rolledBack = append(p.rolledBack, ids...)
			p.mu.Unlock()
		}
		return
	}
	if err := tx.Commit(tctx); err != nil {
		p.txErr.Add(1) // the judge reads app.committed, so an ambiguous commit is judged by what is there
		return
	}
	p.txOK.Add(1)
	p.mu.Lock()
	p.ackedTx = append(p.ackedTx, ids...)
	p.mu.Unlock()
}

// LostAcknowledged returns the ids whose COMMIT the application saw succeed
// but that are not in app.committed now (a failover that lost acknowledged
// transactions).
func (p *Pipeline) LostAcknowledged(ctx context.Context) ([]string, error) {
	p.mu.Lock()
	ids := append([]string(nil), p.ackedTx...)
	p.mu.Unlock()
	var missing []string
	err := p.appPool.QueryRow(ctx, `SELECT coalesce(array_agg(x), '{}') FROM unnest($1::uuid[]) x
		WHERE NOT EXISTS (SELECT 1 FROM app.committed c WHERE c.id = x)`, ids).Scan(&missing)
	return missing, err
}

// TxCounts returns committed and failed transactions of the load.
func (p *Pipeline) TxCounts() (ok, failed int64) { return p.txOK.Load(), p.txErr.Load() }

// CommittedCount is the number of events in app.committed.
func (p *Pipeline) CommittedCount(ctx context.Context) (int, error) {
	var n int
	err := p.appPool.QueryRow(ctx, `SELECT count(*) FROM app.committed`).Scan(&n)
	return n, err
}

// Drained reports whether every committed event reached every subscription
// (a verified 2xx in the receiver's memory; the judge rechecks from the log).
func (p *Pipeline) Drained(ctx context.Context) (bool, string) {
	n, err := p.CommittedCount(ctx)
	if err != nil {
		return false, err.Error()
	}
	got := p.Receiver.Acked()
	want := n * len(p.Subs)
	return got >= want, fmt.Sprintf("%d of %d (event, subscription) pairs acknowledged", got, want)
}

// WatchDrain records, in the background, the first moment after from at
// which the pipeline is drained; DrainedAfter reports it.
func (p *Pipeline) WatchDrain(ctx context.Context, from time.Time) {
	go func() {
		for ctx.Err() == nil {
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ok, _ := p.Drained(qctx)
			cancel()
			if ok {
				p.mu.Lock()
				p.drainedAt = time.Now()
				p.drainFrom = from
				p.mu.Unlock()
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
}

// DrainedAfter is how long after the load the pipeline was first drained
// (WatchDrain), or -1.
func (p *Pipeline) DrainedAfter() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drainedAt.IsZero() {
		return -1
	}
	return p.drainedAt.Sub(p.drainFrom)
}

// WaitDrained waits up to timeout for Drained and returns how long it took.
func (p *Pipeline) WaitDrained(timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	var last string
	for time.Since(start) < timeout {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ok, msg := p.Drained(ctx)
		cancel()
		if ok {
			return time.Since(start), nil
		}
		last = msg
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start), fmt.Errorf("not drained within %s: %s", timeout, last)
}

// Evidence gathers everything the judge needs, from outside the pipeline.
func (p *Pipeline) Evidence(ctx context.Context) (judge.Evidence, error) {
	var ev judge.Evidence
	rows, err := p.appPool.Query(ctx, `SELECT c.id::text, c.asset_id, coalesce(o.asset_seq, 0)
		FROM app.committed c LEFT JOIN bridge.outbox o ON o.id = c.id`)
	if err != nil {
		return ev, err
	}
	ev.Committed, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (judge.Committed, error) {
		var c judge.Committed
		return c, r.Scan(&c.ID, &c.AssetID, &c.AssetSeq)
	})
	if err != nil {
		return ev, err
	}
	p.mu.Lock()
	ev.RolledBack = append([]string(nil), p.rolledBack...)
	p.mu.Unlock()
	for _, s := range p.Subs {
		ev.Subscriptions = append(ev.Subscriptions, judge.Subscription{Name: s, Secret: p.Secrets[s]})
	}
	if ev.Receipts, err = ReadReceipts(p.Receiver.path); err != nil {
		return ev, err
	}
	rows, err = p.appPool.Query(ctx, `SELECT id::text, status FROM bridge.outbox`)
	if err != nil {
		return ev, err
	}
	ev.Outbox, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (judge.OutboxRow, error) {
		var o judge.OutboxRow
		return o, r.Scan(&o.ID, &o.Status)
	})
	if err != nil {
		return ev, err
	}
	rows, err = p.appPool.Query(ctx, `SELECT s.url, d.event_id, d.status FROM bridge.deliveries d JOIN bridge.subscriptions s ON s.id = d.subscription_id`)
	if err != nil {
		return ev, err
	}
	ev.Deliveries, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (judge.Delivery, error) {
		var d judge.Delivery
		var url string
		err := r.Scan(&url, &d.EventID, &d.Status)
		d.Subscription = url[strings.LastIndex(url, "/")+1:]
		return d, err
	})
	if err != nil {
		return ev, err
	}
	ev.Kafka, err = ReadTopic(ctx, p.Brokers, p.Topic)
	return ev, err
}

// ReadTopic reads every record of topic back, independently of the bridge.
func ReadTopic(ctx context.Context, brokers []string, topic string) ([]judge.KafkaRecord, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadUncommitted()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	var out []judge.KafkaRecord
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("reading %s back: %w (partitions left %v)", topic, ctx.Err(), want)
		}
		fs.EachRecord(func(r *kgo.Record) {
			kr := judge.KafkaRecord{Partition: r.Partition, Offset: r.Offset, Key: string(r.Key),
				ProducerID: r.ProducerID, ProducerEpoch: r.ProducerEpoch}
			for _, h := range r.Headers {
				switch h.Key {
				case contract.HeaderDedupID:
					kr.DedupID = string(h.Value)
				case contract.HeaderAssetSeq:
					kr.AssetSeq, _ = strconv.ParseInt(string(h.Value), 10, 64)
				}
			}
			out = append(out, kr)
			if r.Offset+1 >= want[r.Partition] {
				delete(want, r.Partition)
			}
		})
	}
	return out, nil
}

// Scan runs one query of the judge's kind (outside the bridge) on the
// application's pool and scans its one row into dest.
func (p *Pipeline) Scan(ctx context.Context, sql string, dest ...any) error {
	return p.appPool.QueryRow(ctx, sql).Scan(dest...)
}

// FastLane reports whether the run's deliverers run the fast lane
// (WEBHOOK_FAST_LANE=true): a member's successor then replays the events it
// had not committed past (judge.Evidence.ReplaysAllowed).
func (p *Pipeline) FastLane() bool {
	for _, e := range p.Env {
		if e == "WEBHOOK_FAST_LANE=true" {
			return true
		}
	}
	return false
}
