package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// Durations are Go duration text in both formats, in groups too; slog's
// JSON handler alone writes nanoseconds ("poll_interval":1000000000).
func TestDurationsLoggedAsText(t *testing.T) {
	t.Parallel()
	var js bytes.Buffer
	New(&js, "info", "json").Info("started", "poll_interval", time.Second, "lease", any(1500*time.Millisecond),
		"relay", map[string]any{"ignored": 1})
	New(&js, "info", "json").WithGroup("g").Info("grouped", "timeout", 250*time.Millisecond)
	lines := strings.Split(strings.TrimSpace(js.String()), "\n")
	var first struct {
		PollInterval any `json:"poll_interval"`
		Lease        any `json:"lease"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if first.PollInterval != "1s" || first.Lease != "1.5s" {
		t.Errorf("JSON durations = %v, %v; want \"1s\", \"1.5s\"\n%s", first.PollInterval, first.Lease, lines[0])
	}
	var second struct {
		G struct {
			Timeout any `json:"timeout"`
		} `json:"g"`
	}
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil || second.G.Timeout != "250ms" {
		t.Errorf("grouped duration = %v (%v); want \"250ms\"\n%s", second.G.Timeout, err, lines[1])
	}
	var text bytes.Buffer
	New(&text, "info", "text").Info("started", "poll_interval", time.Second)
	if !strings.Contains(text.String(), "poll_interval=1s") {
		t.Errorf("text: %s", text.String())
	}
}
