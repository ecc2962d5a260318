package pipelinebench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxbridge/bridge/internal/contract"
)

// What a slow second was: the bench records, second by second, what else
// happened in it — the garbage collections of this process (runtime/metrics)
// and of the bridge process (its GODEBUG=gctrace=1 lines on stderr), both
// processes' memory, which processes of the machine had the CPU, what
// PostgreSQL was doing (autovacuum workers, checkpoint writes, wait events),
// the bridge's log lines, and the relay's part of the latency (read from
// the topic: each record's timestamp is when the relay produced it).

// bridgeGC is one garbage collection of the bridge process.
type bridgeGC struct {
	at              time.Time
	pauseMs, cpuMs  float64 // stop-the-world clock time; CPU of the cycle (assists and background marking)
	heapAfterMiB    float64 // live heap the cycle ended with
	heapBeforeMiB   float64
	wallMs          float64 // first pause start to second pause end
	cycleID, forced int
}

// logLine is a line the bridge wrote to stderr that is not a gctrace line.
type logLine struct {
	at   time.Time
	line string
}

// maxLogLines bounds the bridge log lines kept for the result.
const maxLogLines = 500

// stderrTap is the bridge process's stderr: gctrace lines become bridgeGC
// records (not forwarded: one a GC would drown the bench's own output), the
// other lines are kept with their arrival time and forwarded.
type stderrTap struct {
	next io.Writer
	mu   sync.Mutex
	buf  []byte
	gcs  []bridgeGC
	logs []logLine
}

// gctraceRE matches a gctrace line of the Go runtime:
// "gc 12 @3.4s 2%: 0.01+1.2+0.02 ms clock, 0.03+0.5/1.1/0.9+0.05 ms cpu, 10->11->5 MB, …".
var gctraceRE = regexp.MustCompile(`^gc (\d+) @[\d.]+s \d+%: ([\d.]+)\+([\d.]+)\+([\d.]+) ms clock, ([\d.]+)\+([\d.]+)/([\d.]+)/[\d.]+\+([\d.]+) ms cpu, (\d+)->\d+->(\d+) MB`)

func (t *stderrTap) Write(p []byte) (int, error) {
	now := time.Now()
	t.mu.Lock()
	t.buf = append(t.buf, p...)
	var fwd []byte
	for {
		i := bytes.IndexByte(t.buf, '\n')
		if i < 0 {
			break
		}
		line := string(t.buf[:i])
		t.buf = t.buf[i+1:]
		if m := gctraceRE.FindStringSubmatch(line); m != nil {
			f := func(i int) float64 { v, _ := strconv.ParseFloat(m[i], 64); return v }
			id, _ := strconv.Atoi(m[1])
			g := bridgeGC{at: now, cycleID: id, pauseMs: f(2) + f(4), wallMs: f(2) + f(3) + f(4),
				cpuMs: f(5) + f(6) + f(7) + f(8), heapBeforeMiB: f(9), heapAfterMiB: f(10)}
			if strings.Contains(line, "(forced)") {
				g.forced = 1
			}
			t.gcs = append(t.gcs, g)
			continue
		}
		if len(t.logs) < maxLogLines {
			t.logs = append(t.logs, logLine{at: now, line: line})
		}
		fwd = append(fwd, line...)
		fwd = append(fwd, '\n')
	}
	t.mu.Unlock()
	if len(fwd) > 0 && t.next != nil {
		_, _ = t.next.Write(fwd)
	}
	return len(p), nil
}

func (t *stderrTap) snapshot() ([]bridgeGC, []logLine) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.gcs), slices.Clone(t.logs)
}

// benchRuntime is this process's runtime as runtime/metrics shows it.
type benchRuntime struct {
	gcCPU     float64 // seconds of CPU spent on GC so far
	gcCycles  uint64
	heapBytes uint64 // heap objects (live and not yet swept)
	pauses    []uint64
	schedLat  []uint64
}

var benchMetrics = []metrics.Sample{
	{Name: "/cpu/classes/gc/total:cpu-seconds"},
	{Name: "/gc/cycles/total:gc-cycles"},
	{Name: "/memory/classes/heap/objects:bytes"},
	{Name: "/sched/pauses/total/gc:seconds"},
	{Name: "/sched/latencies:seconds"},
}

// histogram bucket boundaries of the two histograms (fixed for a process).
var pauseBuckets, schedBuckets []float64

var readBenchMu sync.Mutex

func readBenchRuntime() benchRuntime {
	readBenchMu.Lock()
	defer readBenchMu.Unlock()
	metrics.Read(benchMetrics)
	var r benchRuntime
	if s := benchMetrics[0]; s.Value.Kind() == metrics.KindFloat64 {
		r.gcCPU = s.Value.Float64()
	}
	if s := benchMetrics[1]; s.Value.Kind() == metrics.KindUint64 {
		r.gcCycles = s.Value.Uint64()
	}
	if s := benchMetrics[2]; s.Value.Kind() == metrics.KindUint64 {
		r.heapBytes = s.Value.Uint64()
	}
	if s := benchMetrics[3]; s.Value.Kind() == metrics.KindFloat64Histogram {
		h := s.Value.Float64Histogram()
		r.pauses, pauseBuckets = slices.Clone(h.Counts), h.Buckets
	}
	if s := benchMetrics[4]; s.Value.Kind() == metrics.KindFloat64Histogram {
		h := s.Value.Float64Histogram()
		r.schedLat, schedBuckets = slices.Clone(h.Counts), h.Buckets
	}
	return r
}

// histDiff returns, for the histogram counts b−a over buckets, the sum of
// the observations (each at its bucket's lower bound) and the q-quantile
// (the lower bound of the bucket it falls in), in milliseconds.
func histDiff(a, b []uint64, buckets []float64, q float64) (sumMs, qMs float64) {
	if len(a) != len(b) || len(buckets) != len(b)+1 {
		return 0, 0
	}
	var n uint64
	for i := range b {
		n += b[i] - a[i]
	}
	if n == 0 {
		return 0, 0
	}
	rank := uint64(q * float64(n))
	var seen uint64
	qMs = -1
	for i := range b {
		d := b[i] - a[i]
		lo := max(buckets[i], 0)
		sumMs += float64(d) * lo * 1000
		seen += d
		if qMs < 0 && d > 0 && seen > rank {
			qMs = lo * 1000
		}
	}
	return sumMs, max(qMs, 0)
}

// residentMiB is VmRSS of pid in MiB (0 when /proc cannot show it).
func residentMiB(pid int) float64 { return procStatusMiB(pid, "VmRSS:") }

// procStatusMiB is the kB line field of /proc/pid/status in MiB (0 when
// /proc cannot show it).
func procStatusMiB(pid int, field string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// procUse is one process's name and CPU time so far.
type procUse struct {
	name string
	cpu  time.Duration
}

// cpuByProcess is the CPU time so far of every process of the machine, by
// pid; the bench and the bridge (both this binary) are named "bench" and
// "bridge run". A process's reaped children count with it only when its
// parent has another name (a postmaster's backends count as postgres once,
// a shell's finished commands with the shell).
func cpuByProcess(bench, bridge int) map[int]procUse {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	stats := map[int]procStat{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok {
			switch pid {
			case bench:
				st.comm = "bench"
			case bridge:
				st.comm = "bridge run"
			}
			stats[pid] = st
		}
	}
	out := make(map[int]procUse, len(stats))
	for pid, st := range stats {
		u := procUse{name: st.comm, cpu: st.cpu}
		if p, ok := stats[st.ppid]; !ok || p.comm != st.comm {
			u.cpu += st.children
		}
		out[pid] = u
	}
	return out
}

// topProcesses names the processes that used the most CPU between a and b
// (at most n names, each with its cores over secs). Each process's CPU is
// its own difference between the two readings (a kernel worker's name
// changes with its work, so names alone cannot be subtracted), summed by
// the name it has in b; a kernel worker counts under "kworker".
func topProcesses(a, b map[int]procUse, secs float64, n int) string {
	by := map[string]time.Duration{}
	for pid, u := range b {
		d := u.cpu - a[pid].cpu
		if d <= 0 {
			continue
		}
		name := u.name
		if strings.HasPrefix(name, "kworker/") {
			name = "kworker"
		}
		by[name] += d
	}
	type use struct {
		name  string
		cores float64
	}
	var us []use
	for k, d := range by {
		us = append(us, use{k, d.Seconds() / secs})
	}
	slices.SortFunc(us, func(x, y use) int { return cmp.Compare(y.cores, x.cores) })
	parts := make([]string, 0, n)
	for _, u := range us[:min(n, len(us))] {
		parts = append(parts, fmt.Sprintf("%s %.2f", u.name, u.cores))
	}
	return strings.Join(parts, ", ")
}

// pgSample is what PostgreSQL was doing at one instant.
type pgSample struct {
	at                  time.Time
	checkpoints         int64 // completed so far (timed + requested)
	checkpointBuffers   int64 // buffers the checkpointer wrote so far
	backendBuffers      int64 // buffers backends had to write themselves so far
	autovacuum, waiting string
	// maintained: "table:autovacuum count:autoanalyze count" of the run's
	// bridge tables that autovacuum has vacuumed or analyzed so far — a
	// short ANALYZE starts and ends between two samples, but its count
	// still moves.
	maintained map[string][2]int64
	ok         bool
}

const pgSampleSQL = `
SELECT b.checkpoints_timed + b.checkpoints_req, b.buffers_checkpoint, b.buffers_backend,
       coalesce((SELECT string_agg(coalesce(a.datname, '') || ': ' || left(a.query, 80), '; ')
                 FROM pg_stat_activity a WHERE a.backend_type = 'autovacuum worker'), ''),
       coalesce((SELECT string_agg(w, ', ') FROM (
                   SELECT a.wait_event_type || ':' || a.wait_event || ' ×' || count(*) AS w
                   FROM pg_stat_activity a
                   WHERE a.state = 'active' AND a.wait_event IS NOT NULL AND a.pid <> pg_backend_pid()
                   GROUP BY a.wait_event_type, a.wait_event ORDER BY count(*) DESC) x), '')
FROM pg_stat_bgwriter b`

const pgMaintainedSQL = `
SELECT relname, autovacuum_count, autoanalyze_count FROM pg_stat_user_tables
WHERE schemaname = 'bridge' AND autovacuum_count + autoanalyze_count > 0`

// maintainedBetween names the tables autovacuum vacuumed or analyzed
// between two samples.
func maintainedBetween(a, b map[string][2]int64) string {
	var out []string
	for rel, n := range b {
		if d := n[0] - a[rel][0]; d > 0 {
			out = append(out, "vacuumed "+rel)
		}
		if d := n[1] - a[rel][1]; d > 0 {
			out = append(out, "analyzed "+rel)
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// pgSampler reads pgSampleSQL once a second until stopped.
type pgSampler struct {
	mu   sync.Mutex
	xs   []pgSample
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func samplePostgres(ctx context.Context, pool *pgxpool.Pool) *pgSampler {
	p := &pgSampler{done: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			s := pgSample{at: time.Now()}
			qctx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
			err := pool.QueryRow(qctx, pgSampleSQL).Scan(&s.checkpoints, &s.checkpointBuffers, &s.backendBuffers, &s.autovacuum, &s.waiting)
			if err == nil {
				s.maintained = map[string][2]int64{}
				var rel string
				var v, an int64
				rows, qerr := pool.Query(qctx, pgMaintainedSQL)
				if qerr == nil {
					_, qerr = pgx.ForEachRow(rows, []any{&rel, &v, &an}, func() error {
						s.maintained[rel] = [2]int64{v, an}
						return nil
					})
				}
				err = qerr
			}
			cancel()
			s.ok = err == nil
			p.mu.Lock()
			p.xs = append(p.xs, s)
			p.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-p.done:
				return
			case <-t.C:
			}
		}
	}()
	return p
}

func (p *pgSampler) stop() {
	p.once.Do(func() { close(p.done) })
	p.wg.Wait()
}

func (p *pgSampler) samples() []pgSample {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.xs)
}

// tapTopic reads the bench topic from its start and tells arr, for every
// bench.live record, when the relay produced it (the record's timestamp,
// set by the relay's producer) and when this process could first fetch it.
// It runs until ctx ends.
func tapTopic(ctx context.Context, kafkaOpts []kgo.Opt, topic string, arr *arrivals) error {
	opts := append(slices.Clone(kafkaOpts), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	go func() {
		defer cl.Close()
		for {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				var id string
				live := false
				for _, h := range r.Headers {
					switch h.Key {
					case contract.HeaderDedupID:
						id = string(h.Value)
					case contract.HeaderEventType:
						live = string(h.Value) == "bench.live"
					}
				}
				if live && id != "" {
					arr.produced(id, r.Timestamp, now)
				}
			})
		}
	}()
	return nil
}
