package console_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestScreenshotsDocumented: every picture in docs/console/ is one the
// browser tests take (and check, see documented), and every page they
// document has its picture there, shown in docs/console.md. Regenerate them with
// `make console-screenshots`.
func TestScreenshotsDocumented(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "docs", "console", "*.png"))
	if err != nil {
		t.Fatal(err)
	}
	var have []string
	for _, f := range files {
		have = append(have, strings.TrimSuffix(filepath.Base(f), ".png"))
	}
	var want []string
	for name := range documented {
		want = append(want, name)
	}
	slices.Sort(have)
	slices.Sort(want)
	for _, h := range have {
		if !slices.Contains(want, h) {
			t.Errorf("docs/console/%s.png: no browser test takes it (stale); remove it or add it to documented", h)
		}
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "console.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if _, err := os.Stat(filepath.Join("..", "..", "docs", "console", w+".png")); err != nil {
			t.Errorf("docs/console/%s.png is missing: run make console-screenshots", w)
		}
		if !strings.Contains(string(doc), "(console/"+w+".png)") {
			t.Errorf("docs/console.md does not show console/%s.png", w)
		}
	}
}
