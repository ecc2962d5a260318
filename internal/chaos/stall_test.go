package chaos

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/chaos/harness"
	"github.com/outboxbridge/bridge/internal/kafkatest"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

// stallBound is the promise: a consumer SIGKILLed under load costs its
// partitions at most this long without progress.
const stallBound = 10 * time.Second

// The consumer group after a SIGKILL, measured from outside (the group's
// committed offsets as the broker reports them, polled every 100 ms) with
// the product's default CONSUMER_SESSION_TIMEOUT: two consumers in one group
// under load; one is SIGKILLed — kept down (a lost node: the survivor learns
// of the rebalance on its next heartbeat after the dead member's session
// expired) or restarted by the supervisor at once (a crash: its new member
// joins at once, and the join still waits for the dead one to expire). The
// stall is the time from the kill until every partition has committed
// again. Each must stay within stallBound, and the run is judged as the
// other scenarios (nothing lost, no duplicate, order kept). `make test` runs
// it after the rest of the suite, by itself (the Makefile's ALONE_TESTS says
// why): the rejoin part of the stall is round trips that a machine loaded by
// every other package stretches by seconds.
func TestConsumerStallAfterSIGKILL(t *testing.T) {
	t.Parallel()
	kills := 2 // one of each kind: `make test`
	if long() {
		kills = 10
	}
	brokers := kafkatest.RealBrokers(t)
	db := pgtest.Empty(t)
	p := harness.NewPipeline(t, harness.PipelineConfig{DBURL: db.URL, Brokers: brokers, Subs: []string{"a"},
		Procs: map[string]int{"relay": 1, "consume": 2, "deliver": 1}})
	p.StartProcs()
	p.SampleUntilEnd()
	g, err := p.Group()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var consumers []*harness.Proc
	for _, pr := range p.Procs {
		if pr.Kind == "consume" {
			consumers = append(consumers, pr)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	loadDone := make(chan struct{})
	go func() { p.Load(ctx, 30); close(loadDone) }()

	type kill struct {
		Held  bool    `json:"held_down"`
		Stall float64 `json:"stall_seconds"`
	}
	var results []kill
	for i := 0; i < kills; i++ {
		settle(t, g, len(consumers), p.Parts)
		held := i%2 == 0
		victim := consumers[i%len(consumers)]
		killedAt := time.Now()
		var pid int
		if held {
			pid = p.KillAndHold(victim)
		} else {
			pid = p.Kill(victim)
		}
		// The base is read once the victim is gone: a commit it sent just
		// before the kill can land after a base read earlier, and would
		// count as the group moving on (seen: 0.1 s "stalls").
		if !harness.WaitGone(pid, 10*time.Second) {
			t.Fatalf("%s (pid %d) still there 10s after SIGKILL", victim.Name, pid)
		}
		bctx, bcancel := context.WithTimeout(context.Background(), 5*time.Second)
		base, err := g.Commits(bctx)
		bcancel()
		if err != nil || len(base) != int(p.Parts) {
			t.Fatalf("committed offsets: %v %v", base, err)
		}
		actx, acancel := context.WithTimeout(context.Background(), 2*time.Minute)
		done, per, err := g.AllAdvanced(actx, base, 100*time.Millisecond)
		acancel()
		if err != nil {
			t.Fatalf("kill %d (%s): %v", i+1, victim.Name, err)
		}
		var parts []string
		for part, at := range per {
			parts = append(parts, fmt.Sprintf("p%d %.1fs", part, at.Sub(killedAt).Seconds()))
		}
		slices.Sort(parts)
		stall := done.Sub(killedAt)
		t.Logf("kill %d of %s (held down %t): every partition committed again after %.2fs (%v)", i+1, victim.Name, held, stall.Seconds(), parts)
		results = append(results, kill{Held: held, Stall: stall.Seconds()})
		if stall > stallBound {
			t.Errorf("kill %d of %s: the group stalled %.1fs, bound %s", i+1, victim.Name, stall.Seconds(), stallBound)
		}
		victim.Resume()
	}
	cancel()
	<-loadDone
	loadEnd := time.Now()
	p.WatchDrain(t.Context(), loadEnd)
	stalls := make([]float64, 0, len(results))
	for _, r := range results {
		stalls = append(stalls, r.Stall)
	}
	slices.Sort(stalls)
	extra := map[string]any{"stalls after SIGKILL": results}
	if len(stalls) > 0 {
		extra["stall median seconds"] = stalls[len(stalls)/2]
		extra["stall max seconds"] = stalls[len(stalls)-1]
	}
	finish(t, p, "consumer group stall after SIGKILL (default session timeout)", loadEnd, 60*time.Second, stallBound, 0, false, extra)
}

// settle waits until the group is stable with members consumers, each
// assigned partitions, and every partition has committed since: no
// rebalance of an earlier kill is still under way (and each partition has a
// committed offset, so the measurement has a base on every one).
func settle(t *testing.T, g *harness.Group, members int, parts int32) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		m, err := g.Members(ctx)
		c, cerr := g.Commits(ctx)
		cancel()
		ok := err == nil && cerr == nil && len(m) == members && len(c) == int(parts)
		for _, n := range m {
			ok = ok && n > 0
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("group not stable with %d members and commits on %d partitions within 2m: %v %v, commits %v %v", members, parts, m, err, c, cerr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base, err := g.Commits(ctx)
	if err == nil {
		_, _, err = g.AllAdvanced(ctx, base, 100*time.Millisecond)
	}
	if err != nil {
		t.Fatalf("group not progressing on every partition: %v", err)
	}
}
