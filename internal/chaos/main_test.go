// Package chaos is the fault suite: the bridge's processes, brokers and
// databases are killed, restarted and failed over under load, and package
// judge decides from outside evidence whether every promise held. See
// docs/failure-modes.md.
package chaos

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// The scenarios wait mostly on outages, restarts and drains, not on CPU:
// run them side by side even on a 2-core machine (go test's default
// -parallel is GOMAXPROCS), so the suite fits in CI's budget. An explicit
// -parallel wins.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.parallel"); f != nil && f.Value.String() == strconv.Itoa(runtime.GOMAXPROCS(0)) {
		_ = flag.Set("test.parallel", "8")
	}
	os.Exit(m.Run())
}
