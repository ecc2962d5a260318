// Package bench holds what the benchmarks (bench relay, bench deliver, bench
// pipeline) and the memory tests share: the heap watch. Each stage's bench
// lives beside it (relaybench, delivery/deliverbench).
package bench

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// HeapWatch samples the Go heap in use (runtime.MemStats.HeapInuse: what the
// process holds, fragmentation included) until Stop, and keeps the peak. The
// backlog-sized claims and batches a memory bound exists to prevent show up
// here; the samples are cheap (a stop-the-world of microseconds) at the
// intervals the callers use.
type HeapWatch struct {
	peak atomic.Uint64
	done chan struct{}
	wg   sync.WaitGroup
}

// WatchHeap starts sampling every interval, the first sample at once.
func WatchHeap(interval time.Duration) *HeapWatch {
	w := &HeapWatch{done: make(chan struct{})}
	w.sample()
	w.wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-t.C:
				w.sample()
			}
		}
	})
	return w
}

func (w *HeapWatch) sample() {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	for {
		p := w.peak.Load()
		if m.HeapInuse <= p || w.peak.CompareAndSwap(p, m.HeapInuse) {
			return
		}
	}
}

// Stop ends sampling and returns the peak in bytes. Safe to call once.
func (w *HeapWatch) Stop() uint64 {
	close(w.done)
	w.wg.Wait()
	return w.peak.Load()
}

// MiB converts bytes to mebibytes, as the benches print them.
func MiB(bytes uint64) float64 { return float64(bytes) / (1 << 20) }

// HeapInuseNow returns the heap in use after a garbage collection: the
// baseline a watch's peak is compared with.
func HeapInuseNow() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
