package harness

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/outboxbridge/bridge/internal/service"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// sample is what the sampler saw at one instant, from outside the pipeline.
type sample struct {
	At      time.Time
	OK      bool  // both the database and the broker answered
	Inbox   int64 // consumer_inbox rows (records turned into deliveries)
	Lag     int64 // the group's lag on the topic (end offsets - committed)
	Owners  []string
	Expired []bool
	// Per partition: the group's committed offset and its lag.
	Commit map[int32]int64
	PLag   map[int32]int64
}

// SampleUntilEnd runs Sample every 200ms from now until the test returns
// (its cleanup waits for the sampler to stop), so every scenario's stall
// and lag judgments read samples taken the same way.
func (p *Pipeline) SampleUntilEnd() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Sample(p.T.Context(), 200*time.Millisecond) // cancelled as the test returns
	}()
	p.T.Cleanup(func() { <-done })
}

// StartSampled starts the processes, samples until the test ends and waits
// until the pipeline has settled: the opening of every scenario under load.
func (p *Pipeline) StartSampled() {
	p.T.Helper()
	p.StartProcs()
	p.SampleUntilEnd()
	p.WaitSettled(2 * time.Minute)
}

// Sample watches the pipeline every interval until ctx ends: the consumer
// inbox, the group's lag and the relay lanes' owners.
func (p *Pipeline) Sample(ctx context.Context, interval time.Duration) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.Brokers...), kgo.RequestTimeoutOverhead(time.Second), kgo.RetryTimeout(time.Second))
	if err != nil {
		p.T.Errorf("sampler client: %v", err)
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	group := "chaos-" + p.Topic
	service.Every(ctx, service.Loop{Name: "chaos sampler", Interval: interval}, func(ctx context.Context) error {
		s := sample{At: time.Now(), OK: true, Commit: map[int32]int64{}, PLag: map[int32]int64{}}
		qctx, cancel := context.WithTimeout(ctx, interval*4)
		if err := p.appPool.QueryRow(qctx, `SELECT count(*) FROM bridge.consumer_inbox`).Scan(&s.Inbox); err != nil {
			s.OK = false
		}
		rows, err := p.appPool.Query(qctx, `SELECT coalesce(owner, ''), expires_at < now() FROM bridge.relay_lanes ORDER BY lane`)
		if err == nil {
			for rows.Next() {
				var o string
				var exp bool
				if rows.Scan(&o, &exp) == nil {
					s.Owners = append(s.Owners, o)
					s.Expired = append(s.Expired, exp)
				}
			}
			rows.Close()
		}
		if lags, err := adm.Lag(qctx, group); err == nil {
			if gl, ok := lags[group]; ok && gl.Error() == nil {
				for part, pl := range gl.Lag[p.Topic] {
					if pl.Lag > 0 {
						s.Lag += pl.Lag
					}
					s.Commit[part] = pl.Commit.At
					s.PLag[part] = pl.Lag
				}
			} else {
				s.OK = false
			}
		} else {
			s.OK = false
		}
		cancel()
		p.mu.Lock()
		p.samples = append(p.samples, s)
		p.mu.Unlock()
		return nil
	})
}

// Stall is a period in which a partition had records waiting (lag > 0)
// and the group committed nothing on it: its records were not being turned
// into deliveries (a dead member still holding it, a rebalance, an outage).
type Stall struct {
	Partition int32
	From, To  time.Time
	Outage    bool // overlaps an outage (broker or database down) or a sampler blind spot
}

func (s Stall) Len() time.Duration { return s.To.Sub(s.From) }

// Stalls returns every partition stall of at least min.
func (p *Pipeline) Stalls(min time.Duration) []Stall {
	p.mu.Lock()
	samples := append([]sample(nil), p.samples...)
	events := append([]Event(nil), p.events...)
	p.mu.Unlock()
	var out []Stall
	cur := map[int32]*Stall{}
	last := map[int32]int64{}
	for _, s := range samples {
		if !s.OK {
			for _, st := range cur {
				st.Outage = true
				st.To = s.At
			}
			continue
		}
		for part, lag := range s.PLag {
			prev, seen := last[part]
			last[part] = s.Commit[part]
			progressing := lag == 0 || !seen || s.Commit[part] != prev
			st := cur[part]
			if progressing {
				if st != nil {
					st.To = s.At
					out = append(out, *st)
					delete(cur, part)
				}
				continue
			}
			if st == nil {
				st = &Stall{Partition: part, From: s.At}
				cur[part] = st
			}
			st.To = s.At
		}
	}
	for _, st := range cur {
		out = append(out, *st)
	}
	var res []Stall
	for _, st := range out {
		for _, e := range events {
			if !e.End.IsZero() && e.What != "receiver down" && e.At.Before(st.To) && e.End.Add(2*time.Second).After(st.From) {
				st.Outage = true
			}
		}
		if st.Len() >= min {
			res = append(res, st)
		}
	}
	return res
}

// Takeover is how long the lanes of a SIGKILLed relay took to have a live
// owner again.
type Takeover struct {
	Proc   string
	Lanes  int
	After  time.Duration // -1: not seen
	Outage bool          // PostgreSQL or the broker was down meanwhile (no lease can move)
}

// Takeovers measures, for each SIGKILL of a relay or run process, the time
// from the kill until none of the lanes it held at the kill is still owned
// by it (and each has an unexpired owner).
func (p *Pipeline) Takeovers() []Takeover {
	p.mu.Lock()
	samples := append([]sample(nil), p.samples...)
	events := append([]Event(nil), p.events...)
	p.mu.Unlock()
	var out []Takeover
	for _, e := range events {
		if e.Pid == 0 || (e.Kind != "relay" && e.Kind != "run") {
			continue
		}
		mark := fmt.Sprintf("/%d/", e.Pid)
		var held []int
		for _, s := range samples {
			if s.At.After(e.At) {
				break
			}
			if len(s.Owners) == 0 {
				continue
			}
			held = held[:0]
			for i, o := range s.Owners {
				if strings.Contains(o, mark) {
					held = append(held, i)
				}
			}
		}
		to := Takeover{Proc: strings.TrimPrefix(e.What, "SIGKILL "), Lanes: len(held), After: -1}
		for _, o := range events {
			if !o.End.IsZero() && o.What != "receiver down" && o.At.Before(e.At.Add(RelayLease+time.Second)) && o.End.After(e.At) {
				to.Outage = true
			}
		}
		if len(held) == 0 {
			out = append(out, to)
			continue
		}
		for _, s := range samples {
			if !s.At.After(e.At) || len(s.Owners) == 0 {
				continue
			}
			done := true
			for _, i := range held {
				if strings.Contains(s.Owners[i], mark) || s.Owners[i] == "" || s.Expired[i] {
					done = false
					break
				}
			}
			if done {
				to.After = s.At.Sub(e.At)
				break
			}
		}
		out = append(out, to)
	}
	return out
}
