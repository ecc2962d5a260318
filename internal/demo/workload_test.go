package demo

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestPlanHasEveryLifecycleStep(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ events, assets int }{{20, 5}, {200, 10}, {2000, 50}, {2001, 1}, {100, 25}} {
		txs := plan("demo.assets.x", "x", c.events, c.assets, 100, 42)
		var total, poison, pairs, nulls, deletes int
		lastType := map[string]string{} // asset → last event type
		poisonAsset := ""
		afterPoison := 0
		for _, tx := range txs {
			total += len(tx.events)
			for _, ev := range tx.events {
				if ev.AssetID != tx.asset {
					t.Fatalf("%+v: event of asset %q in a transaction of %q", c, ev.AssetID, tx.asset)
				}
				if prev := lastType[ev.AssetID]; prev == typeDeleted {
					t.Fatalf("%+v: %s after %s of %s", c, ev.EventType, prev, ev.AssetID)
				}
				lastType[ev.AssetID] = ev.EventType
				if !json.Valid(ev.Payload) {
					t.Fatalf("%+v: payload not JSON", c)
				}
			}
			switch {
			case tx.poison:
				poison++
				poisonAsset = tx.asset
				if len(tx.events[0].Payload) <= 100 {
					t.Fatalf("%+v: poison payload %d bytes, want over the limit", c, len(tx.events[0].Payload))
				}
			case tx.asset == "":
				nulls += len(tx.events)
			case len(tx.events) == 2:
				pairs++
				if tx.events[0].EventType != typeVersionPublished || tx.events[1].EventType != typeVersionExpired {
					t.Fatalf("%+v: pair is %s, %s; want publish then expire", c, tx.events[0].EventType, tx.events[1].EventType)
				}
			case tx.events[0].EventType == typeDeleted:
				deletes++
			}
			if poisonAsset != "" && !tx.poison && tx.asset == poisonAsset {
				afterPoison++
			}
		}
		if total != c.events {
			t.Errorf("%+v: %d events planned", c, total)
		}
		if poison != 1 || pairs == 0 || nulls < 3 || deletes < 1 {
			t.Errorf("%+v: poison %d, publish-and-expire %d, null-asset %d, deletions %d", c, poison, pairs, nulls, deletes)
		}
		if c.events >= 200 && afterPoison == 0 {
			t.Errorf("%+v: no event of the poison's asset after it: the demo would not show it holds nothing back", c)
		}
	}
}

func TestIncompressibleDoesNotCompress(t *testing.T) {
	t.Parallel()
	s := incompressible(4096)
	if len(s) != 4096 || strings.Count(s, s[:8]) > 1 {
		t.Errorf("len %d, or repeats", len(s))
	}
}

func TestPercentiles(t *testing.T) {
	t.Parallel()
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	p50, p95, p99, mx := percentiles(ds)
	if p50 != 50*time.Millisecond || p95 != 95*time.Millisecond || p99 != 99*time.Millisecond || mx != 100*time.Millisecond {
		t.Errorf("got %v %v %v %v", p50, p95, p99, mx)
	}
	if a, b, c, d := percentiles(nil); a+b+c+d != 0 {
		t.Error("empty input")
	}
}

func TestSummaryErr(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		s    Summary
		want string // "" for nil
	}{
		{"clean", Summary{Enqueued: 10, Poison: 1, Delivered: 9}, ""},
		{"order", Summary{OrderViolations: 2}, "2 order violation(s)"},
		{"signature", Summary{SignatureFailures: 1}, "1 signature failure(s)"},
		{"missing", Summary{Missing: 3}, "3 event(s) never delivered"},
		{"missing after Ctrl-C is expected", Summary{Missing: 3, Interrupted: true}, ""},
		{"violations count after Ctrl-C too", Summary{OrderViolations: 1, Interrupted: true}, "1 order violation(s)"},
	}
	for _, c := range cases {
		err := c.s.Err()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{}, ""},
		{Options{Events: 19}, "--events"},
		{Options{Events: 100, Assets: 26}, "--assets"},
		{Options{Assets: -1}, "--assets"},
		{Options{Duration: -time.Second}, "--duration"},
	} {
		err := c.o.Validate()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", c.o, err, c.want)
		}
	}
}
