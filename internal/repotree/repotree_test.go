package repotree

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// root is the repository's top level (this package is internal/repotree).
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// trackedTextFiles lists the tracked files (git ls-files) that are text: no
// NUL byte in their first 8,000 bytes, the way git itself tells binary from
// text. A file tracked but deleted in the work tree is skipped.
func trackedTextFiles(t *testing.T) map[string][]byte {
	t.Helper()
	dir := root(t)
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files in %s: %v (these checks need the git checkout)", dir, err)
	}
	files := map[string][]byte{}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if bytes.IndexByte(b[:min(len(b), 8000)], 0) >= 0 {
			continue
		}
		files[name] = b
	}
	if len(files) < 50 {
		t.Fatalf("git ls-files found %d text files in %s; expected the repository", len(files), dir)
	}
	return files
}

// workLog matches a reference to the rounds of work the code was built in:
// numbered sessions and issue numbers belong to the tracker and to git
// history, where they can be looked up, not to files a reader takes as a
// description of the product.
var workLog = regexp.MustCompile(`(?i)(session|issue) #?[0-9]`)

// TestNoWorkLogReferencesInTrackedFiles fails on any tracked text file that
// mentions a session or issue number. go.sum is hashes, not prose.
func TestNoWorkLogReferencesInTrackedFiles(t *testing.T) {
	t.Parallel()
	for name, b := range trackedTextFiles(t) {
		if filepath.Base(name) == "go.sum" {
			continue
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := workLog.FindString(line); m != "" {
				t.Errorf("%s:%d mentions %q: say what the rule is and which failure it prevents; the history stays in git", name, i+1, m)
			}
		}
	}
}

// TestWorkLogPattern: the pattern catches the spellings a work log uses and
// leaves ordinary prose alone.
func TestWorkLogPattern(t *testing.T) {
	t.Parallel()
	// Spelt in two pieces so that this file does not match itself.
	for _, s := range []string{"see Sess" + "ion 12", "iss" + "ue 7 asked", "(iss" + "ue #29)", "sess" + "ion 3's run"} {
		if !workLog.MatchString(s) {
			t.Errorf("%q not caught", s)
		}
	}
	for _, s := range []string{"a session 's", "the consumer's session timeout", "an issue with 5", "CONSUMER_SESSION_TIMEOUT=8s", "issues show"} {
		if workLog.MatchString(s) {
			t.Errorf("%q caught", s)
		}
	}
}

// mdLink is a Markdown link's target: [text](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestMarkdownLinksResolve fails on a relative link in a tracked Markdown
// file to a file the tree does not have (a renamed or deleted doc): a reader
// following it finds nothing.
func TestMarkdownLinksResolve(t *testing.T) {
	t.Parallel()
	dir := root(t)
	files := trackedTextFiles(t)
	for name, b := range files {
		if !strings.HasSuffix(name, ".md") {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			p := filepath.Join(filepath.Dir(name), target)
			if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
				t.Errorf("%s links to %s, which does not exist", name, m[1])
			}
		}
	}
}

// TestREADMEIsShort: the README is what a newcomer reads first, in a few
// minutes: what the bridge is, the two commands, how to call it, how to run
// it. References belong in docs/.
func TestREADMEIsShort(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	if n := strings.Count(text, "\n"); n > 250 {
		t.Errorf("README.md has %d lines, more than 250: move reference material to docs/", n)
	}
	for _, want := range []string{"make demo", "make test", "outbox.EnqueueBatch", "bridge.enqueue(", "examples/"} {
		if !strings.Contains(text, want) {
			t.Errorf("README.md does not mention %q", want)
		}
	}
}
