// Package version holds the build version, set with
// -ldflags "-X github.com/outboxbridge/bridge/internal/version.Version=v1.2.3".
package version

import "runtime/debug"

// Version of this build; "dev" unless set at link time.
var Version = "dev"

// String returns Version, or the module version recorded by the Go toolchain.
func String() string {
	if Version != "dev" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return Version
}

// UserAgent is sent with every webhook request.
func UserAgent() string { return "outbox-bridge/" + String() }
