// Package bench holds what the benchmarks (bench relay, bench deliver, bench
// pipeline) and the memory tests share: the heap watch. Each stage's bench
// lives beside it (relaybench, delivery/deliverbench).
package bench

import (
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// HeapWatch samples the Go heap in use (runtime.MemStats.HeapInuse: what the
// process holds, fragmentation included) until Stop, and keeps the peak. The
// backlog-sized claims and batches a memory bound exists to prevent show up
// here. A sample reads runtime/metrics, which does not stop the world:
// runtime.ReadMemStats does, and every 20 ms it preempted every goroutine of
// the process being measured — about 2% of a fast-lane drain's CPU with
// three lane members, growing with the goroutines running.
type HeapWatch struct {
	peak    atomic.Uint64
	done    chan struct{}
	wg      sync.WaitGroup
	samples []metrics.Sample
}

// heapInuseMetrics add up to runtime.MemStats.HeapInuse: the bytes of heap
// objects and the free space in the spans that hold them.
var heapInuseMetrics = []string{"/memory/classes/heap/objects:bytes", "/memory/classes/heap/unused:bytes"}

// WatchHeap starts sampling every interval, the first sample at once.
func WatchHeap(interval time.Duration) *HeapWatch {
	w := &HeapWatch{done: make(chan struct{})}
	for _, name := range heapInuseMetrics {
		w.samples = append(w.samples, metrics.Sample{Name: name})
	}
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
	metrics.Read(w.samples)
	var inuse uint64
	for _, s := range w.samples {
		if s.Value.Kind() == metrics.KindUint64 {
			inuse += s.Value.Uint64()
		}
	}
	for {
		p := w.peak.Load()
		if inuse <= p || w.peak.CompareAndSwap(p, inuse) {
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
