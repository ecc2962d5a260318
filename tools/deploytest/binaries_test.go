package deploytest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// tempDirs are removed when the tests end (TestMain).
var tempDirs []string

// cachedBinary returns the path of the executable that `go run <args>` in
// dir would run, built once and then taken from the Go build cache (go run
// caches executables), so a warm `make test-deploy` links neither promtool
// nor the bridge again. The first build hands out a temporary copy that go
// run deletes on exit; asking again then names the cached one. If neither
// survives (a Go that does not cache them), it builds into a temporary
// directory instead.
func cachedBinary(dir string, args ...string) (string, error) {
	ask := func() (string, error) {
		cmd := exec.Command("go", append([]string{"run", "-exec", "echo"}, args...)...)
		cmd.Dir = dir
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("go run %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return strings.TrimSpace(string(out)), nil
	}
	for range 2 {
		path, err := ask()
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
	}
	tmp, err := os.MkdirTemp("", "deploytest-bin-")
	if err != nil {
		return "", err
	}
	tempDirs = append(tempDirs, tmp)
	out := filepath.Join(tmp, filepath.Base(args[len(args)-1]))
	cmd := exec.Command("go", append(append([]string{"build", "-o", out}, args[:len(args)-1]...), args[len(args)-1])...)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return out, nil
}
