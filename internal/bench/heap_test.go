package bench

import (
	"runtime"
	"testing"
	"time"
)

// The watch reads runtime/metrics instead of runtime.ReadMemStats; the two
// must agree on the heap in use, or the benches' peak_heap_mib changes
// meaning.
func TestWatchReadsHeapInuse(t *testing.T) {
	keep := make([][]byte, 0, 64)
	for range 64 {
		keep = append(keep, make([]byte, 1<<20))
	}
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	w := WatchHeap(time.Hour)
	got := w.Stop()
	runtime.KeepAlive(keep)
	if got < m.HeapInuse*9/10 || got > m.HeapInuse*11/10 {
		t.Fatalf("watch read %d bytes of heap in use, runtime.MemStats.HeapInuse %d", got, m.HeapInuse)
	}
	if got < 64<<20 {
		t.Fatalf("watch read %d bytes with 64 MiB held", got)
	}
}
