package demo

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// ProgressMode selects how the run shows progress.
type ProgressMode int

const (
	// ProgressLines prints one plain line per second (stdout not a terminal).
	ProgressLines ProgressMode = iota
	// ProgressBar draws a live bar (stdout is a terminal).
	ProgressBar
	// ProgressNone prints nothing until the summary.
	ProgressNone
)

// Progress is one reading of the pipeline.
type Progress struct {
	Elapsed   time.Duration
	Enqueued  int
	Relayed   int
	Delivered int
	Failed    int // parked as FAILED
	Dead      int
	// Rate: deliveries per second over the last couple of seconds.
	Rate float64
	// Lag: events committed but not yet delivered, parked or dead — what is
	// in the pipeline right now.
	Lag int
}

// display renders progress readings.
type display interface {
	update(Progress)
	expect(delivered int)
	finish(Progress)
}

func newDisplay(mode ProgressMode, w io.Writer, expected int) display {
	switch mode {
	case ProgressBar:
		return &barDisplay{w: w, bar: progressbar.NewOptions(max(expected, 1),
			progressbar.OptionSetWriter(w),
			// Shrunk by the library to what an 80-column terminal has left
			// after the counters, so the line never wraps (a wrapped line
			// cannot be redrawn in place).
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(),
			progressbar.OptionSetDescription("starting"),
			progressbar.OptionSetRenderBlankState(true),
			progressbar.OptionSetPredictTime(false),
		)}
	case ProgressLines:
		return &lineDisplay{w: w, every: time.Second}
	default:
		return nopDisplay{}
	}
}

type barDisplay struct {
	w   io.Writer
	bar *progressbar.ProgressBar
}

func (d *barDisplay) update(p Progress) {
	// The bar's count is the deliveries; dead ones show only when there are.
	dead := ""
	if p.Dead > 0 {
		dead = fmt.Sprintf(" · dead %d", p.Dead)
	}
	d.bar.Describe(fmt.Sprintf("enq %d · relayed %d · failed %d%s · lag %d · %3.0f/s ",
		p.Enqueued, p.Relayed, p.Failed, dead, p.Lag, p.Rate))
	_ = d.bar.Set(min(p.Delivered, d.bar.GetMax()))
}

// expect changes the bar's length once the workload is over (a --duration
// cap or Ctrl-C may end it early).
func (d *barDisplay) expect(n int) { d.bar.ChangeMax(max(n, 1)) }

func (d *barDisplay) finish(p Progress) {
	d.update(p)
	_ = d.bar.Exit()
	fmt.Fprintln(d.w)
}

type lineDisplay struct {
	w     io.Writer
	every time.Duration
	next  time.Duration
}

func (d *lineDisplay) update(p Progress) {
	if p.Elapsed < d.next {
		return
	}
	d.next = p.Elapsed.Truncate(d.every) + d.every
	d.print(p)
}

func (d *lineDisplay) expect(int) {}

func (d *lineDisplay) finish(p Progress) { d.print(p) }

func (d *lineDisplay) print(p Progress) {
	fmt.Fprintf(d.w, "%6.1fs  enqueued %d  relayed %d  delivered %d  failed %d  dead %d  %.0f/s  lag %d\n",
		p.Elapsed.Seconds(), p.Enqueued, p.Relayed, p.Delivered, p.Failed, p.Dead, p.Rate, p.Lag)
}

type nopDisplay struct{}

func (nopDisplay) update(Progress) {}
func (nopDisplay) expect(int)      {}
func (nopDisplay) finish(Progress) {}
