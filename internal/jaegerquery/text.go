package jaegerquery

import (
	"fmt"
	"strings"
	"time"
)

// Text draws the waterfall in a terminal: one line per span (indented by
// depth) with its offset, duration and a bar on a common time axis, then
// the gaps between the stages.
func (t *Trace) Text(width int) string {
	if width < 20 {
		width = 20
	}
	// One service (the demo's single process): the label needs no service.
	withService := len(t.Services) > 1
	label := func(s Span) string { return label(s, withService) }
	nameW := 0
	for _, s := range t.Spans {
		nameW = max(nameW, 2*s.Depth+len(label(s)))
	}
	nameW = min(nameW, 56)
	var b strings.Builder
	fmt.Fprintf(&b, "trace %s: %d spans, %s, services %s\n", t.ID, len(t.Spans), Round(t.Duration), strings.Join(t.Services, ", "))
	for _, s := range t.Spans {
		name := strings.Repeat("  ", s.Depth) + label(s)
		if len(name) > nameW {
			name = name[:nameW-1] + "…"
		}
		from, to := 0, 0
		if t.Duration > 0 {
			from = int(float64(width) * float64(s.Offset) / float64(t.Duration))
			to = int(float64(width) * float64(s.Offset+s.Duration) / float64(t.Duration))
		}
		from = min(from, width-1)
		to = min(max(to, from+1), width)
		bar := strings.Repeat(" ", from) + strings.Repeat("█", to-from) + strings.Repeat(" ", width-to)
		fmt.Fprintf(&b, "  %-*s  +%-9s %9s  |%s|\n", nameW, name, Round(s.Offset), Round(s.Duration), bar)
	}
	if len(t.Gaps) > 0 {
		b.WriteString("  between stages:\n")
		for _, g := range t.Gaps {
			fmt.Fprintf(&b, "    %-22s %9s  (%s → %s)\n", g.Name, Round(g.Duration), g.From, g.To)
		}
	}
	return b.String()
}

// label is a span's name with its service, status and error mark.
func label(s Span, withService bool) string {
	l := s.Name
	if s.StatusCode != 0 {
		l += fmt.Sprintf(" %d", s.StatusCode)
	}
	if s.Error {
		l += " ✗"
	}
	if withService {
		l += " [" + s.Service + "]"
	}
	return l
}

// Round shows a duration at a useful precision: µs below 1ms, 0.1ms below
// 1s, ms above.
func Round(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	default:
		return d.Round(time.Millisecond).String()
	}
}
