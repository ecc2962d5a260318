package delivery

import (
	"net/http"
	"testing"
	"time"
)

func TestRetryAfterIsClampedToTwiceTheSchedule(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                string
		scheduled, jittered time.Duration
		retryAfter          time.Duration
		hasRetryAfter       bool
		want                time.Duration
	}{
		{"no Retry-After: the jittered schedule", 5 * time.Minute, 5*time.Minute + 20*time.Second, 0, false, 5*time.Minute + 20*time.Second},
		{"shorter Retry-After: the schedule still holds", 5 * time.Minute, 4 * time.Minute, 10 * time.Second, true, 4 * time.Minute},
		{"longer Retry-After within 2x: honoured", 5 * time.Minute, 5 * time.Minute, 8 * time.Minute, true, 8 * time.Minute},
		{"Retry-After beyond 2x: clamped", 5 * time.Minute, 5 * time.Minute, 2 * time.Hour, true, 10 * time.Minute},
		{"exactly 2x", 30 * time.Second, 30 * time.Second, time.Minute, true, time.Minute},
		{"immediate retry: clamped to 0", 0, 0, time.Hour, true, 0},
	}
	for _, c := range cases {
		if got := retryDelay(c.scheduled, c.jittered, c.retryAfter, c.hasRetryAfter); got != c.want {
			t.Errorf("%s: retryDelay = %s, want %s", c.name, got, c.want)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		status int
		value  string
		want   time.Duration
		ok     bool
	}{
		{429, "120", 2 * time.Minute, true},
		{503, "0", 0, true},
		{503, now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{503, now.Add(-time.Minute).Format(http.TimeFormat), 0, true},
		{429, "soon", 0, false},
		{429, "-5", 0, false},
		{429, "", 0, false},
		{502, "7", 7 * time.Second, true},
		{504, now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second, true},
		{500, "120", 0, false}, // only the slow-down answers (429, 502, 503, 504) are asked to wait
		{302, "120", 0, false},
	}
	for _, c := range cases {
		h := http.Header{}
		if c.value != "" {
			h.Set("Retry-After", c.value)
		}
		got, ok := parseRetryAfter(c.status, h, now)
		if got != c.want || ok != c.ok {
			t.Errorf("%d Retry-After %q = %s,%v; want %s,%v", c.status, c.value, got, ok, c.want, c.ok)
		}
	}
}

func TestJitterStaysWithin20Percent(t *testing.T) {
	t.Parallel()
	for range 1000 {
		d := jitter(time.Minute)
		if d < 48*time.Second || d > 72*time.Second {
			t.Fatalf("jitter(1m) = %s, outside ±20%%", d)
		}
	}
	if jitter(0) != 0 {
		t.Fatal("jitter(0) must be 0")
	}
}
