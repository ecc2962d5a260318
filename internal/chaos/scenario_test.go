package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/chaos/harness"
	"github.com/outboxbridge/bridge/internal/chaos/judge"
)

// long is `make chaos`: CHAOS=long runs the scenarios longer, harder and
// with longer outages; the default is the short variant `make test` runs.
func long() bool { return os.Getenv("CHAOS") == "long" }

// loadFor is how long a single-fault scenario offers load: 30s in `make
// test`, a minute with CHAOS=long.
func loadFor() time.Duration {
	if long() {
		return time.Minute
	}
	return 30 * time.Second
}

// plan is one scenario's timing.
type plan struct {
	load          time.Duration
	rate          int // transactions per second
	killEvery     [2]time.Duration
	receiverDown  time.Duration
	brokerDown    time.Duration
	postgresDown  time.Duration
	drainBound    time.Duration
	stallBound    time.Duration // longest consumer-group stall not explained by an outage
	takeoverBound time.Duration
}

// The drain bounds (from the end of the load or the last outage): the tail
// is the flaky subscription's null-asset stream — one stream, three
// sequential attempts per event, about one event a second — so it grows
// with the load's length. Measured: 34 s short (load 45 on 2 cores), 63 s
// long (load 10–20); the bounds are a little over twice that.
func scenarioPlan() plan {
	if long() {
		return plan{load: 120 * time.Second, rate: 50, killEvery: [2]time.Duration{3 * time.Second, 5 * time.Second},
			receiverDown: 5 * time.Second, brokerDown: 20 * time.Second, postgresDown: 6 * time.Second,
			drainBound: 150 * time.Second, stallBound: stallBound, takeoverBound: harness.RelayLease + time.Second + takeoverSlack}
	}
	return plan{load: 30 * time.Second, rate: 30, killEvery: [2]time.Duration{3 * time.Second, 5 * time.Second},
		receiverDown: 5 * time.Second, brokerDown: 10 * time.Second, postgresDown: 4 * time.Second,
		drainBound: 75 * time.Second, stallBound: stallBound, takeoverBound: harness.RelayLease + time.Second + takeoverSlack}
}

// takeoverSlack is the measurement's resolution: the sampler reads the
// lanes every 200 ms, and on a loaded machine its query lands late.
const takeoverSlack = 500 * time.Millisecond

// report is what a run measured, printed and (CHAOS_REPORT=path) appended as
// one JSON line for the closing note.
type report struct {
	Scenario            string           `json:"scenario"`
	Events              int              `json:"events_committed"`
	TxCommitted         int64            `json:"tx_committed"`
	TxFailed            int64            `json:"tx_failed"`
	RolledBack          int              `json:"rolled_back_events"`
	Kills               map[string]int   `json:"kills"`
	Outages             []string         `json:"outages"`
	Verdict             judge.Verdict    `json:"verdict"`
	DrainSeconds        float64          `json:"drain_seconds"`
	DrainAfterFaults    float64          `json:"drain_after_last_fault_seconds"`
	DrainBound          float64          `json:"drain_after_last_fault_bound_seconds"`
	LongestStall        float64          `json:"longest_group_stall_seconds"`
	LongestStallAny     float64          `json:"longest_group_stall_incl_outages_seconds"`
	LongestStallChained float64          `json:"longest_group_stall_two_kills_seconds"`
	Takeovers           []takeoverReport `json:"relay_takeovers"`
	Unexpected          map[string]int   `json:"unexpected_exits"`
	LostAcknowledged    int              `json:"acknowledged_commits_lost"`
	ExitReasons         []string         `json:"unexpected_exit_examples,omitempty"`
	Extra               map[string]any   `json:"extra,omitempty"`
}

type takeoverReport struct {
	Proc    string  `json:"proc"`
	Lanes   int     `json:"lanes"`
	Seconds float64 `json:"seconds"`
	Outage  bool    `json:"during_outage"`
}

func (r *report) print(t *testing.T) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "== %s ==\n", r.Scenario)
	fmt.Fprintf(&b, "events committed %d (%d transactions; %d failed during outages), rolled-back events %d\n",
		r.Events, r.TxCommitted, r.TxFailed, r.RolledBack)
	fmt.Fprintf(&b, "acknowledged commits missing from the database afterwards: %d\n", r.LostAcknowledged)
	fmt.Fprintf(&b, "kills %v; outages %v; unexpected exits %v\n", r.Kills, r.Outages, r.Unexpected)
	v := r.Verdict
	fmt.Fprintf(&b, "lost %d (not in kafka %d) / rolled-back published %d / duplicates %d (redeliveries with the same id %d, re-produced after a lost mark %d, of them posted again %d, replayed after a member died %d) / "+
		"order violations %d / two-in-flight %d / bad signatures %d / FAILED %d / dead %d\n",
		v.Lost, v.LostInKafka, v.RolledBackPublished, v.Duplicates, v.Redeliveries, v.Reproduced, v.ReproducedBodies, v.Replayed, v.OrderViolations, v.TwoInFlight,
		v.BadSignatures, v.Failed, v.Dead)
	fmt.Fprintf(&b, "drain after the load %.1fs, after the last fault ended %.1fs (bound %.0fs); longest consumer-group stall after a SIGKILL %.1fs (%.1fs when two kills chained, %.1fs including outages)\n",
		r.DrainSeconds, r.DrainAfterFaults, r.DrainBound, r.LongestStall, r.LongestStallChained, r.LongestStallAny)
	for _, to := range r.Takeovers {
		if to.Lanes == 0 {
			continue // it had not taken lanes yet since its restart
		}
		during := ""
		if to.Outage {
			during = " (during an outage: not held to the bound)"
		}
		fmt.Fprintf(&b, "relay lane takeover after SIGKILL of %s (%d lanes): %.1fs%s\n", to.Proc, to.Lanes, to.Seconds, during)
	}
	for _, x := range r.ExitReasons {
		fmt.Fprintf(&b, "exit not caused by the test: %s\n", x)
	}
	for k, v := range r.Extra {
		fmt.Fprintf(&b, "%s: %v\n", k, v)
	}
	for _, p := range v.Problems {
		fmt.Fprintf(&b, "  %s\n", p)
	}
	t.Log("\n" + b.String())
	if path := os.Getenv("CHAOS_REPORT"); path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err == nil {
			js, _ := json.Marshal(r)
			f.Write(append(js, '\n'))
			f.Close()
		}
	}
}

// finish drains, stops the processes, judges and reports. It fails the test
// on any broken promise or a drain slower than bound, measured from the end
// of the load or of the last outage, whichever is later: how long the
// pipeline takes to catch up once the faults stop. (From the load's end
// alone it would measure how fast a broker restarts on the machine: 10–130 s
// here, depending on the load.)
func finish(t *testing.T, p *harness.Pipeline, name string, loadEnd time.Time, bound time.Duration, stallBound time.Duration, takeoverBound time.Duration, dbFaults bool, extra map[string]any) report {
	t.Helper()
	_, derr := p.WaitDrained(bound + 60*time.Second)
	drain := p.DrainedAfter() // first drained moment, measured from the end of the load
	drainedAt := p.DrainedAt()
	if drain < 0 {
		drain = time.Since(loadEnd)
		drainedAt = time.Now()
	}
	from := loadEnd
	if e := p.LastFaultEnd(); e.After(from) {
		from = e
	}
	afterFaults := max(drainedAt.Sub(from), 0)
	p.StopProcs()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ev, err := p.Evidence(ctx)
	if err != nil {
		t.Fatalf("gather evidence: %v", err)
	}
	ev.SessionDuplicatesAllowed = dbFaults
	ev.ReplaysAllowed = p.FastLane()
	lostAck, err := p.LostAcknowledged(ctx)
	if err != nil {
		t.Fatalf("acknowledged commits: %v", err)
	}
	v := judge.Judge(ev)
	r := report{Scenario: name, Events: len(ev.Committed), RolledBack: len(ev.RolledBack), Verdict: v,
		Kills: map[string]int{}, Unexpected: map[string]int{}, DrainSeconds: drain.Seconds(), DrainAfterFaults: afterFaults.Seconds(), DrainBound: bound.Seconds(), Extra: extra}
	r.TxCommitted, r.TxFailed = p.TxCounts()
	r.LostAcknowledged = len(lostAck)
	for _, e := range p.Events() {
		if strings.HasPrefix(e.What, "SIGKILL ") && e.Kind != "" {
			r.Kills[e.Kind]++
		}
		if !e.End.IsZero() {
			r.Outages = append(r.Outages, fmt.Sprintf("%s %.1fs", e.What, e.End.Sub(e.At).Seconds()))
		}
	}
	for _, pr := range p.Procs {
		for _, x := range pr.Exits() {
			if !x.Killed && x.Tail != "" {
				r.Unexpected[pr.Kind]++
				if len(r.ExitReasons) < 6 {
					r.ExitReasons = append(r.ExitReasons, fmt.Sprintf("%s at %s after %.1fs up (%v): %.300s",
						pr.Name, x.At.Format("15:04:05.0"), x.Uptime.Seconds(), x.Err, x.Tail))
				}
			}
		}
	}
	events := p.Events()
	for _, st := range p.Stalls(0) {
		if st.Len().Seconds() > r.LongestStallAny {
			r.LongestStallAny = st.Len().Seconds()
		}
		if st.Outage {
			continue
		}
		// Held to the bound: a stall that one SIGKILL of a process with a
		// consumer explains. Kills come every few seconds, so two of them can
		// chain their stalls into one longer period.
		kills := 0
		for _, e := range events {
			if (e.Kind == "consume" || e.Kind == "run") && e.At.After(st.From.Add(-10*time.Second)) && e.At.Before(st.To) {
				kills++
			}
		}
		if kills > 1 {
			if st.Len().Seconds() > r.LongestStallChained {
				r.LongestStallChained = st.Len().Seconds()
			}
			continue
		}
		if st.Len().Seconds() > r.LongestStall {
			r.LongestStall = st.Len().Seconds()
		}
	}
	var worstTakeover time.Duration
	for _, to := range p.Takeovers() {
		r.Takeovers = append(r.Takeovers, takeoverReport{Proc: to.Proc, Lanes: to.Lanes, Seconds: to.After.Seconds(), Outage: to.Outage})
		if to.Lanes > 0 && !to.Outage && (to.After < 0 || to.After > worstTakeover) {
			worstTakeover = to.After
			if to.After < 0 {
				worstTakeover = time.Hour
			}
		}
	}
	r.print(t)
	if v.Broken() {
		t.Errorf("promises broken: %s", v)
	}
	if len(lostAck) > 0 {
		t.Errorf("%d events whose transaction's COMMIT succeeded are not in the database (e.g. %s)", len(lostAck), lostAck[0])
	}
	if derr != nil {
		t.Errorf("drain: %v", derr)
	} else if afterFaults > bound {
		t.Errorf("drain after the load and the last fault took %s, bound %s", afterFaults.Round(100*time.Millisecond), bound)
	}
	if stallBound > 0 && r.LongestStall > stallBound.Seconds() {
		t.Errorf("consumer group stalled %.1fs (not during an outage), bound %s", r.LongestStall, stallBound)
	}
	if takeoverBound > 0 && worstTakeover > takeoverBound {
		t.Errorf("relay lane takeover took %s, bound %s (RELAY_LEASE_TIMEOUT + 1s + %s sampling slack)", worstTakeover.Round(100*time.Millisecond), takeoverBound, takeoverSlack)
	}
	if t.Failed() {
		for _, pr := range p.Procs {
			t.Logf("---- %s (exits %d) ----\n%s", pr.Name, len(pr.Exits()), pr.LogTail(1500))
		}
	}
	return r
}

// killer SIGKILLs a bridge process every killEvery (random in the range)
// until ctx ends, cycling through the process kinds so each is killed.
func killer(ctx context.Context, p *harness.Pipeline, every [2]time.Duration, wg *sync.WaitGroup) {
	defer wg.Done()
	byKind := map[string][]*harness.Proc{}
	var kinds []string
	for _, pr := range p.Procs {
		if byKind[pr.Kind] == nil {
			kinds = append(kinds, pr.Kind)
		}
		byKind[pr.Kind] = append(byKind[pr.Kind], pr)
	}
	sort.Strings(kinds)
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	// A relay first: its takeover is then measured before the first
	// broker or database outage (during one, no lease can move).
	order := map[string]int{"relay": 0, "consume": 1, "deliver": 2, "run": 3}
	sort.Slice(kinds, func(i, j int) bool { return order[kinds[i]] < order[kinds[j]] })
	for i := 0; ; i++ {
		d := every[0] + time.Duration(rng.Int64N(int64(every[1]-every[0])+1))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		procs := byKind[kinds[i%len(kinds)]]
		victim := procs[rng.IntN(len(procs))]
		if i == 0 {
			// The first relay kill hits the one holding the most lanes, so
			// there is a takeover to measure (one replica may hold them all).
			lanes := p.LaneCounts()
			for _, pr := range procs {
				if lanes[pr.Pid()] > lanes[victim.Pid()] {
					victim = pr
				}
			}
		}
		p.Kill(victim)
	}
}

// at runs f at offset from start, unless ctx ended.
func at(ctx context.Context, start time.Time, offset time.Duration, wg *sync.WaitGroup, f func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(start.Add(offset))):
		}
		f()
	}()
}

// The whole pipeline under faults, on a PostgreSQL and a Kafka broker of
// the test's own: 2 relays, 2 consumers in one group, 2 deliverers and one
// `bridge run`, SIGKILLed one at a time every few seconds and restarted by a
// supervisor; the receiver down; the broker down; PostgreSQL restarted
// (stopped with -m immediate); one subscription failing each event's first
// two attempts; rolled-back transactions and null-asset events in the load.
// Judged from outside: see package judge.
func TestChaosScenario(t *testing.T) {
	t.Parallel()
	pl := scenarioPlan()
	waitBroker := harness.StartBrokerAsync(t)
	defer waitBroker() //nolint:errcheck // a failed setup below still waits for it before the test ends
	pg := harness.StartPG(t, "primary", nil)
	if err := harness.CreateDB(pg.URL("postgres"), "bridge"); err != nil {
		t.Fatal(err)
	}
	broker, err := waitBroker()
	if err != nil {
		t.Fatal(err)
	}
	url := pg.URL("bridge")
	p := harness.NewPipeline(t, harness.PipelineConfig{DBURL: url, Brokers: []string{broker.Addr()}})
	p.StartSampled()

	ctx, cancel := context.WithTimeout(context.Background(), pl.load)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	wg.Add(1)
	go killer(ctx, p, pl.killEvery, &wg)
	frac := func(f float64) time.Duration { return time.Duration(float64(pl.load) * f) }
	at(ctx, start, frac(0.15), &wg, func() {
		e := harness.Event{At: time.Now(), What: "receiver down"}
		p.Receiver.Down()
		time.Sleep(pl.receiverDown)
		if err := p.Receiver.Up(); err != nil {
			t.Errorf("receiver up: %v", err)
		}
		e.End = time.Now()
		p.Note(e)
	})
	at(ctx, start, frac(0.3), &wg, func() {
		e := harness.Event{At: time.Now(), What: "broker down (SIGKILL)"}
		broker.Kill()
		time.Sleep(pl.brokerDown)
		if err := broker.Start(); err != nil {
			t.Errorf("broker restart: %v", err)
		}
		e.End = time.Now()
		p.Note(e)
	})
	at(ctx, start, frac(0.7), &wg, func() {
		e := harness.Event{At: time.Now(), What: "PostgreSQL down (stop -m immediate)"}
		if err := pg.Stop("immediate"); err != nil {
			t.Errorf("stop postgres: %v", err)
		}
		time.Sleep(pl.postgresDown)
		if err := pg.Start(); err != nil {
			t.Errorf("start postgres: %v\n%s", err, pg.Log())
		}
		e.End = time.Now()
		p.Note(e)
	})
	p.Load(ctx, pl.rate)
	loadEnd := time.Now()
	p.WatchDrain(t.Context(), loadEnd)
	wg.Wait()
	finish(t, p, "single broker: SIGKILLs, receiver/broker/PostgreSQL outages", loadEnd, pl.drainBound, pl.stallBound, pl.takeoverBound, true, nil)
}
