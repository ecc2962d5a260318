package deliverbench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/delivery"
	"github.com/outboxbridge/bridge/internal/pgtest"
)

func TestRunDeliversEverythingInOrder(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	res, err := Run(context.Background(), db.Pool, Options{
		Subscriptions: 2, Assets: 3, Events: 300, LiveEvents: 60, LiveRate: 300,
		Deliverer: delivery.Config{Workers: 8, PollInterval: 50 * time.Millisecond},
		Timeout:   2 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.OrderViolations != 0 || res.NotDelivered != 0 || res.Duplicates != 0 {
		t.Fatalf("violations=%d not delivered=%d duplicates=%d", res.OrderViolations, res.NotDelivered, res.Duplicates)
	}
	if res.DeliveriesPerSecond <= 0 || res.LatencyP99MS <= 0 || res.PeakHeapMiB <= 0 || res.CeilingPerSecond <= 0 {
		t.Fatalf("missing measurements: %+v", res)
	}
}

func TestReceiverCountsOrderViolations(t *testing.T) {
	t.Parallel()
	rc := &receiver{last: map[string]int64{}}
	post := func(path string, seq int) {
		body := `{"asset_id":"a","asset_seq":` + strconv.Itoa(seq) + `,"data":{"t":1}}`
		rc.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
	}
	post("/s/0", 1)
	post("/s/0", 2)
	post("/s/1", 1) // another stream: independent
	post("/s/0", 2) // a duplicate
	post("/s/0", 4) // 3 skipped: would arrive late
	post("/s/0", 3)
	if v, d := rc.violations.Load(), rc.dups.Load(); v != 2 || d != 1 {
		t.Fatalf("violations=%d duplicates=%d, want 2 and 1", v, d)
	}
}
