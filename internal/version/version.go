// Package version holds the build version, set with
// -ldflags "-X github.com/outboxbridge/bridge/internal/version.Version=v1.2.3".
package version

import (
	"runtime/debug"
	"sync"
)

// Version of this build; "dev" unless set at link time.
var Version = "dev"

// String returns Version, or the module version recorded by the Go toolchain.
// It is worked out once: every webhook request sends it (UserAgent), and
// parsing the build information for each one was ~8% of the deliverer's CPU
// in `bench pipeline`.
func String() string { return versionOnce() }

var versionOnce = sync.OnceValue(func() string {
	if Version != "dev" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return Version
})

// UserAgent is sent with every webhook request.
func UserAgent() string { return "outbox-bridge/" + String() }
