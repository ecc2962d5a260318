package deliverbench

import (
	"math"
	"os"
	"path/filepath"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// machineCPU reads /proc/stat's first line: the CPU time every core spent
// busy (user, nice, system, irq, softirq, steal) and in all (busy, idle,
// iowait). ok is false where /proc/stat is not readable.
func machineCPU() (busy, total time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, false
	}
	var v [8]int64
	for i := range v {
		v[i], _ = strconv.ParseInt(f[i+1], 10, 64)
	}
	// user nice system idle iowait irq softirq steal
	b8 := v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
	return time.Duration(b8) * clockTick, time.Duration(b8+v[3]+v[4]) * clockTick, true
}

// brokerCPU sums the CPU time of this machine's Kafka brokers (JVMs running
// kafka.Kafka): what the members' fetches, commits and heartbeats cost the
// broker side. ok is false where none is visible (a broker elsewhere).
func brokerCPU() (total time.Duration, ok bool) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return 0, false
	}
	for _, dir := range dirs {
		cmd, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || !strings.Contains(string(cmd), "\x00kafka.Kafka\x00") {
			continue
		}
		if d, ok2 := pidCPU(dir); ok2 {
			total += d
			ok = true
		}
	}
	return total, ok
}

// pidCPU is the utime+stime of the process whose /proc directory is dir.
func pidCPU(dir string) (time.Duration, bool) {
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return 0, false
	}
	rest := string(stat)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, false
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * clockTick, true
}

// goRuntime is a read of this process's Go runtime counters: garbage
// collections, the collector's CPU, the CPU its Ps spent idle, and the
// histogram of how long runnable goroutines waited for a P.
type goRuntime struct {
	gcCycles     uint64
	gcCPU, idle  float64
	total        float64
	schedBuckets []float64
	schedCounts  []uint64
}

var goRuntimeMetrics = []string{"/gc/cycles/total:gc-cycles", "/cpu/classes/gc/total:cpu-seconds",
	"/cpu/classes/idle:cpu-seconds", "/sched/latencies:seconds", "/cpu/classes/total:cpu-seconds"}

func readGoRuntime() goRuntime {
	s := make([]metrics.Sample, len(goRuntimeMetrics))
	for i, n := range goRuntimeMetrics {
		s[i].Name = n
	}
	metrics.Read(s)
	var g goRuntime
	if s[0].Value.Kind() == metrics.KindUint64 {
		g.gcCycles = s[0].Value.Uint64()
	}
	if s[1].Value.Kind() == metrics.KindFloat64 {
		g.gcCPU = s[1].Value.Float64()
	}
	if s[2].Value.Kind() == metrics.KindFloat64 {
		g.idle = s[2].Value.Float64()
	}
	if s[4].Value.Kind() == metrics.KindFloat64 {
		g.total = s[4].Value.Float64()
	}
	if s[3].Value.Kind() == metrics.KindFloat64Histogram {
		h := s[3].Value.Float64Histogram()
		g.schedBuckets = h.Buckets
		g.schedCounts = append([]uint64(nil), h.Counts...)
	}
	return g
}

// since fills res with what the runtime did from g0 to g over n deliveries.
func (g goRuntime) since(g0 goRuntime, n int, res *Result) {
	res.GCCycles = int64(g.gcCycles - g0.gcCycles)
	if n > 0 {
		res.GCCPUMicrosPerDelivery = (g.gcCPU - g0.gcCPU) * 1e6 / float64(n)
	}
	if t := g.total - g0.total; t > 0 {
		res.GoIdleFraction = (g.idle - g0.idle) / t
	}
	if len(g.schedCounts) == len(g0.schedCounts) && len(g.schedCounts) > 0 {
		d := make([]uint64, len(g.schedCounts))
		var total uint64
		for i := range d {
			d[i] = g.schedCounts[i] - g0.schedCounts[i]
			total += d[i]
		}
		q := func(p float64) float64 {
			want := uint64(math.Ceil(p * float64(total)))
			var c uint64
			for i, x := range d {
				c += x
				if c >= want && x > 0 {
					hi := g.schedBuckets[i+1]
					if math.IsInf(hi, 1) {
						hi = g.schedBuckets[i]
					}
					return hi * 1e6
				}
			}
			return 0
		}
		if total > 0 {
			res.SchedLatencyP50Micros, res.SchedLatencyP99Micros = q(0.5), q(0.99)
			res.SchedSamplesPerDelivery = float64(total) / float64(max(n, 1))
		}
	}
}
