package chaos

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/chaos/harness"
	"github.com/outboxbridge/bridge/internal/kafkatest"
)

// PostgreSQL failover under load: a primary with a synchronous streaming
// standby (both the test's own), DATABASE_URL naming both hosts with
// target_session_attrs=read-write. The primary is stopped with -m immediate
// and the standby promoted: every bridge process reconnects to the new
// primary and carries on; with synchronous replication no transaction
// acknowledged to the application is lost; rows whose SENT mark did not
// replicate are produced again with the same dedup-id (the consumer's inbox
// drops the copy).
func TestPostgresFailover(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.RealBrokers(t)
	primary := harness.StartPG(t, "primary", map[string]string{
		"synchronous_standby_names": "standby1",
		"synchronous_commit":        "on",
	})
	standby := harness.StartStandby(t, primary, "standby1")
	if err := harness.CreateDB(primary.URL("postgres"), "bridge"); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("postgres://bridge@127.0.0.1:%d,127.0.0.1:%d/bridge?sslmode=disable&target_session_attrs=read-write",
		primary.Port, standby.Port)
	p := harness.NewPipeline(t, harness.PipelineConfig{DBURL: url, Brokers: brokers,
		Procs: map[string]int{"relay": 2, "consume": 2, "deliver": 2}})
	p.StartSampled()

	load := loadFor()
	ctx, cancel := context.WithTimeout(context.Background(), load)
	defer cancel()
	var wg sync.WaitGroup
	var promoted time.Duration
	at(ctx, time.Now(), load*2/5, &wg, func() {
		e := harness.Event{At: time.Now(), What: "PostgreSQL failover (primary stop -m immediate, standby promoted)"}
		if err := primary.Stop("immediate"); err != nil {
			t.Errorf("stop primary: %v", err)
		}
		if err := standby.Promote(); err != nil {
			t.Errorf("promote standby: %v\n%s", err, standby.Log())
		}
		e.End = time.Now()
		promoted = e.End.Sub(e.At)
		p.Note(e)
	})
	p.Load(ctx, 30)
	loadEnd := time.Now()
	p.WatchDrain(t.Context(), loadEnd)
	wg.Wait()
	// Drain bound: measured 1.0–2.2 s after the load (the promotion takes
	// under 2 s); a minute leaves room for a loaded machine.
	r := finish(t, p, "PostgreSQL failover to a synchronous standby", loadEnd, time.Minute, 0, 0, true,
		map[string]any{"stop + promote took": promoted.Round(100 * time.Millisecond).String()})
	if r.Events == 0 {
		t.Fatal("no events committed")
	}
}
