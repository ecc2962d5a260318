package tracing_test

import (
	"strings"
	"testing"

	"github.com/google/uuid"
)

// parseTraceparent splits a W3C traceparent into trace id and parent id.
func parseTraceparent(t *testing.T, tp string) (traceID, parentID string) {
	t.Helper()
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || len(parts[1]) != 32 || len(parts[2]) != 16 {
		t.Fatalf("traceparent %q is not W3C", tp)
	}
	return parts[1], parts[2]
}

func uuids(t *testing.T, ids ...string) []uuid.UUID {
	t.Helper()
	out := make([]uuid.UUID, len(ids))
	for i, s := range ids {
		out[i] = uuid.MustParse(s)
	}
	return out
}
