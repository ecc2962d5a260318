package tracing

import (
	"context"
	"regexp"
	"testing"
)

var traceparentRe = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// FuzzTraceparent: any stored traceparent/tracestate pair is taken or
// dropped without panicking; what is taken comes back as a well-formed
// W3C traceparent.
func FuzzTraceparent(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
	f.Add("00-00000000000000000000000000000000-00f067aa0ba902b7-01", "")
	f.Add("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "a=1,a=2")
	f.Add("garbage", "=,=,")
	f.Fuzz(func(t *testing.T, tp, ts string) {
		ctx := ContextWithRemoteParent(context.Background(), tp, ts)
		got, _ := Traceparent(ctx)
		if got != "" && !traceparentRe.MatchString(got) {
			t.Fatalf("traceparent %q came back as %q", tp, got)
		}
	})
}
