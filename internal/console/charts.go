package console

import (
	"net/http"
	"time"
)

// chart is one small time series with its scales: the polyline on a
// chartW×chartH box, the value at the top of the box (the bottom is 0),
// and the times at the left and right edges.
type chart struct {
	Label    string
	Points   string
	Top      string
	Last     string
	From, To time.Time
	Samples  int
}

const chartW, chartH = 240, 40

// newChart scales values (one per snapshot of hist) to a chart; format
// writes a value as the chart's scale shows it.
func newChart(label string, hist []Snapshot, values []float64, format func(float64) string) chart {
	c := chart{Label: label, Points: sparkline(values, chartW, chartH), Samples: len(values)}
	hi := 0.0
	for _, v := range values {
		hi = max(hi, v)
	}
	if hi == 0 {
		hi = 1
	}
	c.Top = format(hi)
	if len(values) > 0 {
		c.Last = format(values[len(values)-1])
	}
	if len(hist) > 0 {
		c.From, c.To = hist[0].At, hist[len(hist)-1].At
	}
	return c
}

func countFormat(v float64) string { return group(int64(v + 0.5)) }

func rateFormat(v float64) string { return trimFloat(v) + "/s" }

func secondsFormat(v float64) string { return human(time.Duration(v * float64(time.Second))) }

func trimFloat(v float64) string {
	if v >= 10 || v == float64(int64(v)) {
		return group(int64(v + 0.5))
	}
	return formatFloat1(v)
}

// subscriptionCharts are one subscription's figures over the sampler's
// window: delivered per second, pending and dead.
func (c *Console) subscriptionCharts(r *http.Request, id string) []chart {
	_, hist := c.sampler.latest(r.Context())
	of := func(f func(subRow) float64) []float64 {
		out := make([]float64, len(hist))
		for i, s := range hist {
			for _, row := range s.Subs {
				if row.Sub.ID == id {
					out[i] = f(row)
					break
				}
			}
		}
		return out
	}
	return []chart{
		newChart("Delivered per second", hist, of(func(s subRow) float64 { return float64(s.Health.DeliveredMinute) / 60 }), rateFormat),
		newChart("Pending", hist, of(func(s subRow) float64 { return float64(s.Health.Pending) }), countFormat),
		newChart("Dead", hist, of(func(s subRow) float64 { return float64(s.Health.Dead) }), countFormat),
	}
}
