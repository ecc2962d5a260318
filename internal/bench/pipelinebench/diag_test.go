package pipelinebench

import (
	"bytes"
	"testing"
	"time"
)

// An event's bookkeeping is dropped once its commit, its record on the topic
// and every subscription's webhook have been seen, in whatever order they
// come, so a long run holds only the events in flight; with keep (the
// exact receiver) every entry stays. Every webhook still gives a sample.
func TestArrivalsDropSettledEvents(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		a := &arrivals{subs: 2, keep: keep, tapped: true, events: map[string]*pending{}}
		t0 := time.Now()
		// e1: commit, record, webhooks. e2: a webhook before the writer
		// noted its commit, the record last.
		a.commit([]string{"e1"}, t0)
		a.produced("e1", t0.Add(time.Millisecond), t0.Add(2*time.Millisecond))
		a.received("e1", t0.Add(5*time.Millisecond))
		a.received("e2", t0.Add(6*time.Millisecond))
		if n := a.pendingEvents(); n != 2 {
			t.Fatalf("keep %t: %d events pending, want 2 (e1 waits for a webhook, e2 for its commit)", keep, n)
		}
		a.received("e1", t0.Add(7*time.Millisecond))
		a.commit([]string{"e2"}, t0.Add(8*time.Millisecond))
		a.received("e2", t0.Add(9*time.Millisecond))
		want := 1 // e2 waits for its record
		if keep {
			want = 2
		}
		if n := a.pendingEvents(); n != want {
			t.Fatalf("keep %t: %d events pending, want %d", keep, n, want)
		}
		a.produced("e2", t0.Add(3*time.Millisecond), t0.Add(4*time.Millisecond))
		if want = 0; keep {
			want = 2
		}
		if n := a.pendingEvents(); n != want {
			t.Fatalf("keep %t: %d events pending after every part was seen, want %d", keep, n, want)
		}
		if len(a.samples) != 4 || len(a.relay) != 2 {
			t.Fatalf("keep %t: %d webhook samples and %d relay samples, want 4 and 2", keep, len(a.samples), len(a.relay))
		}
		if ms := a.samples[0].ms; ms < 4.9 || ms > 5.1 {
			t.Errorf("keep %t: e1's first webhook at %.2f ms after its commit, want 5", keep, ms)
		}
		if r := a.relay[0]; r.ms < 0.9 || r.ms > 1.1 || r.aux < 0.9 || r.aux > 1.1 {
			t.Errorf("keep %t: e1's relay part %.2f ms and fetch %.2f ms, want 1 and 1", keep, r.ms, r.aux)
		}
	}
}

// The bridge's gctrace lines become GC records and are not forwarded; its
// other lines are kept with their time and forwarded whole, also when a
// write ends mid-line.
func TestStderrTapParsesGCTrace(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	tap := &stderrTap{next: &out}
	_, _ = tap.Write([]byte("gc 7 @1.234s 3%: 0.015+2.5+0.040 ms clock, 0.030+0.40/1.1/0.20+0.080 ms cpu, 12->13->6 MB, 14 MB goal, 0 MB stacks, 0 MB globals, 2 P\ntime=x level=WARN msg=\"slow"))
	_, _ = tap.Write([]byte(" relay cycle\"\ngc 8 @2.000s 3%: 1.0+1.0+2.0 ms clock, 0+0/0/0+0 ms cpu, 20->21->7 MB, 14 MB goal, 0 MB stacks, 0 MB globals, 2 P (forced)\n"))
	gcs, logs := tap.snapshot()
	if len(gcs) != 2 || len(logs) != 1 {
		t.Fatalf("%d GCs and %d log lines, want 2 and 1", len(gcs), len(logs))
	}
	g := gcs[0]
	near := func(x, y float64) bool { return x > y-1e-9 && x < y+1e-9 }
	if g.cycleID != 7 || !near(g.pauseMs, 0.055) || !near(g.cpuMs, 1.61) || g.heapBeforeMiB != 12 || g.heapAfterMiB != 6 {
		t.Errorf("gc 7 read as %+v", g)
	}
	if !near(gcs[1].pauseMs, 3) || gcs[1].forced != 1 {
		t.Errorf("gc 8 read as %+v", gcs[1])
	}
	if want := "time=x level=WARN msg=\"slow relay cycle\"\n"; out.String() != want || logs[0].line+"\n" != want {
		t.Errorf("forwarded %q, kept %q; want %q", out.String(), logs[0].line, want)
	}
}

// histDiff reads what happened between two readings of a runtime/metrics
// histogram; its quantile is the bench's (of 100 observations, p99 is the
// largest).
func TestHistDiff(t *testing.T) {
	t.Parallel()
	buckets := []float64{0, 0.001, 0.002, 0.004, 0.008}
	a := []uint64{5, 0, 0, 0}
	b := []uint64{5, 98, 1, 1}
	sum, p99 := histDiff(a, b, buckets, 0.99)
	if sum < 98*1+2+4-0.001 || sum > 98*1+2+4+0.001 || p99 != 4 {
		t.Errorf("sum %.3f ms, p99 %.3f ms; want 104 and 4", sum, p99)
	}
	if s, q := histDiff(b, b, buckets, 0.99); s != 0 || q != 0 {
		t.Errorf("no observations: sum %.3f, p99 %.3f; want 0, 0", s, q)
	}
}

// A process's CPU is its own difference between two readings: a kernel
// worker that changed its name in between does not count its whole life.
func TestTopProcessesByPid(t *testing.T) {
	t.Parallel()
	a := map[int]procUse{1: {"kworker/u8:1-writeback", 90 * time.Second}, 2: {"postgres", 10 * time.Second}, 3: {"postgres", time.Second}}
	b := map[int]procUse{1: {"kworker/u8:1-ext4-rsv-conversion", 90*time.Second + 100*time.Millisecond},
		2: {"postgres", 10*time.Second + 300*time.Millisecond}, 3: {"postgres", time.Second + 200*time.Millisecond}, 4: {"bench", 250 * time.Millisecond}}
	if got, want := topProcesses(a, b, 1, 2), "postgres 0.50, bench 0.25"; got != want {
		t.Errorf("top processes %q, want %q", got, want)
	}
}
