// Package jaegerquery reads one trace from Jaeger's query API
// (GET <JAEGER_QUERY_URL>/api/traces/<id>) and lays it out as a waterfall:
// spans in causal order with their offsets, and the gaps between the
// pipeline's stages — time in the outbox (commit → publish), in Kafka
// (publish → process), in the delivery queue (process → webhook POST) —
// which is what an operator asks of a slow event. The console draws it as
// HTML; `bridge demo` prints it as text.
//
// The Jaeger that scripts/services-up.sh builds from its Go module serves
// this API but no UI, so the bridge draws the trace itself instead of
// linking to a page that is not there.
package jaegerquery

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
)

// ErrNotFound: Jaeger has no trace with that id (not exported yet, expired
// from its storage, or never sampled).
var ErrNotFound = errors.New("trace not found in Jaeger")

var traceIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// ValidTraceID reports whether id is a W3C trace id (32 lowercase hex, not
// all zero).
func ValidTraceID(id string) bool {
	return traceIDPattern.MatchString(id) && id != strings.Repeat("0", 32)
}

// TraceIDOf returns the trace id of a W3C traceparent ("" if malformed).
func TraceIDOf(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || !ValidTraceID(parts[1]) {
		return ""
	}
	return parts[1]
}

// Span is one span of the waterfall.
type Span struct {
	ID, ParentID string
	Name         string
	Service      string
	Kind         string // client, server, producer, consumer, internal
	Start        time.Time
	Duration     time.Duration
	// Offset is Start minus the trace's start.
	Offset time.Duration
	Depth  int
	Error  bool
	// StatusCode is http.response.status_code (0: none).
	StatusCode int
	// Attrs are the span's tags as text, sorted by key.
	Attrs []Attr
}

// End is Start + Duration.
func (s Span) End() time.Time { return s.Start.Add(s.Duration) }

// Attr is one tag.
type Attr struct{ Key, Value string }

// Gap is the time between two stages of the pipeline.
type Gap struct {
	// Name says where the event was ("in the outbox", "in Kafka", "in the
	// delivery queue").
	Name     string
	From, To string // span names
	Duration time.Duration
}

// Trace is a trace laid out as a waterfall.
type Trace struct {
	ID       string
	Start    time.Time
	Duration time.Duration
	Spans    []Span // depth-first, children by start time
	Gaps     []Gap
	Services []string
}

// Client queries one Jaeger.
type Client struct {
	// BaseURL is JAEGER_QUERY_URL (e.g. http://127.0.0.1:16686).
	BaseURL string
	HTTP    *http.Client
}

// New returns a client with a 5s timeout.
func New(baseURL string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), HTTP: &http.Client{Timeout: 5 * time.Second}}
}

// Get fetches and lays out one trace.
func (c *Client) Get(ctx context.Context, traceID string) (*Trace, error) {
	if !ValidTraceID(traceID) {
		return nil, fmt.Errorf("%q is not a trace id (32 lowercase hex digits)", traceID)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+"/api/traces/"+url.PathEscape(traceID), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("query Jaeger at %s: %w", c.BaseURL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return nil, fmt.Errorf("query Jaeger at %s: %w", c.BaseURL, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return nil, ErrNotFound
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("query Jaeger at %s: GET /api/traces/%s answered %s", c.BaseURL, traceID, resp.Status)
	}
	return Parse(body)
}

// apiTrace is the part of /api/traces/{id} the waterfall uses.
type apiTrace struct {
	Data []struct {
		TraceID string `json:"traceID"`
		Spans   []struct {
			SpanID        string `json:"spanID"`
			OperationName string `json:"operationName"`
			ProcessID     string `json:"processID"`
			StartTime     int64  `json:"startTime"` // µs since the epoch
			Duration      int64  `json:"duration"`  // µs
			References    []struct {
				RefType string `json:"refType"`
				SpanID  string `json:"spanID"`
			} `json:"references"`
			Tags []struct {
				Key   string `json:"key"`
				Value any    `json:"value"`
			} `json:"tags"`
		} `json:"spans"`
		Processes map[string]struct {
			ServiceName string `json:"serviceName"`
		} `json:"processes"`
	} `json:"data"`
}

// Parse lays out a /api/traces/{id} answer.
func Parse(body []byte) (*Trace, error) {
	var at apiTrace
	if err := json.Unmarshal(body, &at); err != nil {
		return nil, fmt.Errorf("decode Jaeger trace: %w", err)
	}
	if len(at.Data) == 0 || len(at.Data[0].Spans) == 0 {
		return nil, ErrNotFound
	}
	d := at.Data[0]
	tr := &Trace{ID: d.TraceID}
	byID := map[string]*Span{}
	var spans []*Span
	services := map[string]bool{}
	for _, s := range d.Spans {
		sp := &Span{
			ID:       s.SpanID,
			Name:     s.OperationName,
			Service:  d.Processes[s.ProcessID].ServiceName,
			Start:    time.UnixMicro(s.StartTime),
			Duration: time.Duration(s.Duration) * time.Microsecond,
		}
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" && sp.ParentID == "" {
				sp.ParentID = r.SpanID
			}
		}
		for _, t := range s.Tags {
			v := fmt.Sprint(t.Value)
			switch t.Key {
			case "span.kind":
				sp.Kind = v
			case "error":
				sp.Error = v == "true"
			case "otel.status_code":
				sp.Error = sp.Error || v == "ERROR"
			case "http.response.status_code", "http.status_code":
				fmt.Sscan(v, &sp.StatusCode)
			}
			if !strings.HasPrefix(t.Key, "otel.scope") && t.Key != "internal.span.format" {
				sp.Attrs = append(sp.Attrs, Attr{Key: t.Key, Value: v})
			}
		}
		slices.SortFunc(sp.Attrs, func(a, b Attr) int { return cmp.Compare(a.Key, b.Key) })
		services[sp.Service] = true
		byID[sp.ID] = sp
		spans = append(spans, sp)
	}
	children := map[string][]*Span{}
	var roots []*Span
	for _, sp := range spans {
		if _, ok := byID[sp.ParentID]; ok && sp.ParentID != sp.ID {
			children[sp.ParentID] = append(children[sp.ParentID], sp)
		} else {
			roots = append(roots, sp)
		}
	}
	byStart := func(a, b *Span) int { return cmp.Or(a.Start.Compare(b.Start), cmp.Compare(a.ID, b.ID)) }
	slices.SortFunc(roots, byStart)
	tr.Start = roots[0].Start
	end := tr.Start
	var walk func(sp *Span, depth int)
	seen := map[string]bool{}
	walk = func(sp *Span, depth int) {
		if seen[sp.ID] {
			return
		}
		seen[sp.ID] = true
		sp.Depth = depth
		if sp.Start.Before(tr.Start) {
			tr.Start = sp.Start
		}
		if sp.End().After(end) {
			end = sp.End()
		}
		tr.Spans = append(tr.Spans, *sp)
		kids := children[sp.ID]
		slices.SortFunc(kids, byStart)
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	for i := range tr.Spans {
		tr.Spans[i].Offset = tr.Spans[i].Start.Sub(tr.Start)
	}
	tr.Duration = end.Sub(tr.Start)
	for s := range services {
		tr.Services = append(tr.Services, s)
	}
	slices.Sort(tr.Services)
	tr.Gaps = gaps(tr.Spans, byID)
	return tr, nil
}

// stage names a span of the pipeline by what it is.
func stage(s Span) string {
	switch {
	case strings.HasPrefix(s.Name, "publish "):
		return "publish"
	case strings.HasPrefix(s.Name, "process "):
		return "process"
	case strings.HasPrefix(s.Name, "webhook POST"):
		return "webhook"
	}
	return ""
}

// gaps finds, for each publish, process and first webhook attempt, the
// time since the stage before it ended: its parent span (the app's span for
// publish: the row waited from the transaction to the relay; publish for
// process: the record sat in Kafka; process for the webhook: the delivery
// waited in bridge.deliveries).
func gaps(spans []Span, byID map[string]*Span) []Gap {
	names := map[string]string{"publish": "in the outbox", "process": "in Kafka", "webhook": "in the delivery queue"}
	var out []Gap
	firstWebhook := map[string]bool{} // per parent process span
	for _, s := range spans {
		st := stage(s)
		if st == "" {
			continue
		}
		p, ok := byID[s.ParentID]
		if !ok {
			continue
		}
		if st == "webhook" {
			// The attempt's parent is the process span; later attempts wait
			// for their retry, not in the queue.
			if firstWebhook[p.ID+"/"+webhookTarget(s)] {
				continue
			}
			firstWebhook[p.ID+"/"+webhookTarget(s)] = true
		}
		from := p.End()
		if from.After(s.Start) {
			// The stage before had not ended when this one began: the
			// application's span still open when its transaction committed
			// and the relay picked the row up, or a consumer that fetched
			// the record before the producer had its ack. Count from the
			// start of the stage before.
			from = p.Start
		}
		out = append(out, Gap{Name: names[st], From: p.Name, To: s.Name, Duration: max(s.Start.Sub(from), 0)})
	}
	return out
}

func webhookTarget(s Span) string { return strings.TrimPrefix(s.Name, "webhook POST") }

// Complete reports whether the trace holds every stage of the pipeline (a
// publish, a process and a webhook attempt): spans arrive in Jaeger from
// three services at their own pace, and a reader waiting for the whole
// picture polls until this holds.
func (t *Trace) Complete() bool {
	seen := map[string]bool{}
	for _, s := range t.Spans {
		seen[stage(s)] = true
	}
	return seen["publish"] && seen["process"] && seen["webhook"]
}
