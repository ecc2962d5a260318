package testkit

import (
	"bytes"
	"strings"
	"sync"
)

// LogBuffer is a log sink that a process's goroutines write while the test
// reads it: a bare bytes.Buffer shared that way is a data race -race reports.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// LineWith returns the first line containing every one of subs.
func (b *LogBuffer) LineWith(subs ...string) (string, bool) {
next:
	for line := range strings.SplitSeq(b.String(), "\n") {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		return line, true
	}
	return "", false
}
