package console

import (
	"context"
	"sync"
	"time"

	"github.com/outboxbridge/bridge/internal/consumer"
	"github.com/outboxbridge/bridge/internal/delivery/store"
	"github.com/outboxbridge/bridge/internal/outboxstore"
)

// chartWindow is how far back the overview's charts reach.
const chartWindow = 15 * time.Minute

// ratesEvery is how often the attempt rates (success over the last hour,
// deliveries per second) are re-read: they scan the last hour's attempt
// log, so not at every sample.
const ratesEvery = 30 * time.Second

// Snapshot is one reading of everything the overview shows.
type Snapshot struct {
	At         time.Time
	Topics     []outboxstore.TopicStats
	Throughput outboxstore.Throughput
	Lag        []consumer.PartitionLag
	LagTotal   int64
	LagError   string
	Subs       []subRow
	Pending    int64
	InFlight   int64
	Dead       int64
	Delivered  float64 // per second, last minute, all subscriptions
	Disabled   int
	Error      string
}

type subRow struct {
	Sub    store.Subscription
	Health store.SubscriptionHealth
}

// sampler reads a Snapshot every few seconds into a ring covering
// chartWindow. Pages render from the latest one, so ten browsers polling
// the overview cost the database what one does — nothing more than the
// sampler's own reads. It reads only while someone looked at the console in
// the last chartWindow: an unwatched replica does not count its tables.
type sampler struct {
	c     *Console
	every time.Duration
	cap   int

	mu       sync.Mutex
	ring     []Snapshot
	rates    map[string]store.SubscriptionHealth
	ratesAt  time.Time
	lastView time.Time
	running  bool
	wake     chan struct{}
	done     chan struct{}
	stopped  chan struct{}
	once     sync.Once
}

func newSampler(c *Console, every time.Duration) *sampler {
	s := &sampler{c: c, every: every, cap: int(chartWindow/every) + 1,
		wake: make(chan struct{}, 1), done: make(chan struct{}), stopped: make(chan struct{})}
	go s.loop()
	return s
}

func (s *sampler) stop() {
	s.once.Do(func() { close(s.done) })
	<-s.stopped
}

// viewed marks the console as watched (every signed-in request).
func (s *sampler) viewed() {
	s.mu.Lock()
	s.lastView = time.Now()
	idle := !s.running
	s.mu.Unlock()
	if idle {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

func (s *sampler) loop() {
	defer close(s.stopped)
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		s.mu.Lock()
		active := time.Since(s.lastView) < chartWindow
		s.running = active
		s.mu.Unlock()
		if active {
			s.sample()
		}
		select {
		case <-s.done:
			return
		case <-t.C:
		case <-s.wake:
		}
	}
}

func (s *sampler) sample() {
	ctx, cancel := context.WithTimeout(context.Background(), max(s.every, 5*time.Second))
	defer cancel()
	s.keep(s.c.read(ctx))
}

// keep appends snap to the ring, dropping the oldest beyond its capacity.
func (s *sampler) keep(snap Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ring = append(s.ring, snap)
	if len(s.ring) > s.cap {
		s.ring = s.ring[len(s.ring)-s.cap:]
	}
}

// latest returns the newest snapshot, reading one now if there is none yet
// (the first page after a quiet period) or the newest is stale.
func (s *sampler) latest(ctx context.Context) (Snapshot, []Snapshot) {
	s.mu.Lock()
	var last Snapshot
	if n := len(s.ring); n > 0 {
		last = s.ring[n-1]
	}
	s.mu.Unlock()
	if last.At.IsZero() || time.Since(last.At) > 3*s.every {
		s.keep(s.c.read(ctx))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	hist := make([]Snapshot, len(s.ring))
	copy(hist, s.ring)
	return hist[len(hist)-1], hist
}

// read takes one Snapshot through the stores' own functions (the same
// figures `bridge outbox stats` and /metrics report).
func (c *Console) read(ctx context.Context) Snapshot {
	snap := Snapshot{At: time.Now()}
	var err error
	fail := func(e error) {
		if e != nil && snap.Error == "" {
			snap.Error = e.Error()
		}
	}
	snap.Topics, err = outboxstore.ReadTopicStats(ctx, c.pool)
	fail(err)
	snap.Throughput, err = outboxstore.ReadThroughput(ctx, c.pool, time.Minute)
	fail(err)
	subs, err := c.subs.List(ctx)
	fail(err)
	health, err := c.deliveries.Health(ctx)
	fail(err)
	rates, err := c.sampler.attemptRates(ctx)
	fail(err)
	for _, sub := range subs {
		h := health[sub.ID].WithRates(rates[sub.ID])
		sub.Secret = ""
		snap.Subs = append(snap.Subs, subRow{Sub: sub, Health: h})
		snap.Pending += h.Pending
		snap.InFlight += h.InFlight
		snap.Dead += h.Dead
		snap.Delivered += float64(h.DeliveredMinute) / 60
		if !sub.Enabled {
			snap.Disabled++
		}
	}
	if adm := c.lagAdmin(); adm != nil {
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		snap.Lag, err = consumer.GroupLag(lctx, adm, c.cfg.ConsumerGroup)
		cancel()
		if err != nil {
			snap.LagError = err.Error()
		}
		for _, l := range snap.Lag {
			if l.Lag > 0 {
				snap.LagTotal += l.Lag
			}
		}
	}
	return snap
}

// attemptRates returns the cached attempt rates, re-reading them when
// older than ratesEvery (or never read).
func (s *sampler) attemptRates(ctx context.Context) (map[string]store.SubscriptionHealth, error) {
	s.mu.Lock()
	rates, at := s.rates, s.ratesAt
	s.mu.Unlock()
	if rates != nil && time.Since(at) < ratesEvery {
		return rates, nil
	}
	rates, err := s.c.deliveries.AttemptRates(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.rates, s.ratesAt = rates, time.Now()
	s.mu.Unlock()
	return rates, nil
}

// ratesRead is when the cached attempt rates were read.
func (s *sampler) ratesRead() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ratesAt
}

// health is every subscription's counts now, with the cached rates.
func (c *Console) health(ctx context.Context) (map[string]store.SubscriptionHealth, error) {
	h, err := c.deliveries.Health(ctx)
	if err != nil {
		return nil, err
	}
	rates, err := c.sampler.attemptRates(ctx)
	if err != nil {
		return nil, err
	}
	for id, v := range h {
		h[id] = v.WithRates(rates[id])
	}
	return h, nil
}

// series extracts one figure from each snapshot, for a chart.
func series(hist []Snapshot, f func(Snapshot) float64) []float64 {
	out := make([]float64, len(hist))
	for i, s := range hist {
		out[i] = f(s)
	}
	return out
}
