package relaybench

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxbridge/bridge/internal/outboxstore"
	"github.com/outboxbridge/bridge/internal/relay"
	"github.com/outboxbridge/bridge/outbox/schema"
)

// SchemaOptions configures SchemaDrain.
type SchemaOptions struct {
	Events       int // per drain; default 50000
	Assets       int // default 1000
	PayloadBytes int // default 300
	Partitions   int32
	Rounds       int // ungoverned+governed pairs; default 3
	// Kind is the governed topic's schema type: "json" (default) or "avro"
	// (the JSON payload written as Avro binary).
	Kind string
}

// SchemaResult is the drain rate of a governed topic against an ungoverned
// one in the same run (JSON field names are stable: add, never rename).
type SchemaResult struct {
	Schema       string `json:"schema"`
	Events       int    `json:"events"`
	Assets       int    `json:"assets"`
	PayloadBytes int    `json:"payload_bytes"`
	SchemaID     int    `json:"schema_id"`
	// Per round, in the order run (each round drains the ungoverned topic,
	// then the governed one).
	UngovernedDrainRates []float64 `json:"ungoverned_drain_rates"`
	GovernedDrainRates   []float64 `json:"governed_drain_rates"`
	// Medians of the rounds.
	UngovernedDrainRate float64 `json:"ungoverned_drain_rate"`
	GovernedDrainRate   float64 `json:"governed_drain_rate"`
	// GovernedRatio = GovernedDrainRate / UngovernedDrainRate.
	GovernedRatio float64 `json:"governed_ratio"`
	// CeilingProduce: Kafka produce alone, same client options, same run.
	CeilingProduce float64 `json:"ceiling_produce"`
	// ValuesMadeNs: mean cost of one Registry.Value call per event, ungoverned
	// and governed, measured alone on the same payload.
	ValueUngovernedNs float64 `json:"value_ungoverned_ns"`
	ValueGovernedNs   float64 `json:"value_governed_ns"`
}

// benchSchema is the JSON Schema of the bench payload (a JSON string of
// PayloadBytes-2 'x's, outboxstore.BenchFill): the pattern makes the
// validator read every character. Apicurio Registry takes a document for a
// JSON Schema by its $schema (or an object's properties), so it names it.
const benchSchema = `{"$schema":"http://json-schema.org/draft-07/schema#","title":"BenchPayload","type":"string","pattern":"^x*$","maxLength":1000000}`

// benchAvroSchema is the Avro schema of the same payload: a string, written
// as Avro binary (its length, then its bytes).
const benchAvroSchema = `{"type":"string"}`

// benchSchemaOf is the schema type and text for kind ("json" or "avro").
func benchSchemaOf(kind string) (sr.SchemaType, string) {
	if kind == "avro" {
		return sr.TypeAvro, benchAvroSchema
	}
	return sr.TypeJSON, benchSchema
}

// SchemaDrain drains the same backlog from an ungoverned topic and from a
// governed one (JSON Schema validated and framed, or Avro written as binary, by reg), round after round,
// with the relay's value hook set for both (so the ungoverned drain pays the
// registry look-up an ungoverned topic pays in production).
func SchemaDrain(ctx context.Context, pool *pgxpool.Pool, kafkaOpts []kgo.Opt, cfg relay.Config, reg *schema.Registry, o SchemaOptions, progress func(string)) (*SchemaResult, error) {
	cfg = cfg.WithDefaults()
	o.Events = cmp.Or(o.Events, 50000)
	o.Assets = cmp.Or(o.Assets, 1000)
	o.PayloadBytes = cmp.Or(o.PayloadBytes, 300)
	o.Partitions = cmp.Or(o.Partitions, 6)
	o.Rounds = cmp.Or(o.Rounds, 3)
	if progress == nil {
		progress = func(string) {}
	}
	o.Kind = cmp.Or(o.Kind, "json")
	schemaType, schemaText := benchSchemaOf(o.Kind)
	res := &SchemaResult{Schema: o.Kind, Events: o.Events, Assets: o.Assets, PayloadBytes: o.PayloadBytes}
	var topics []string
	adm, closeAdmin, err := scratchTopicAdmin(ctx, kafkaOpts, &topics)
	if err != nil {
		return nil, err
	}
	defer closeAdmin()
	newTopic := func(kind string) (string, error) {
		name := fmt.Sprintf("bridge-bench-%s-%d", kind, time.Now().UnixNano())
		if err := createTopic(ctx, adm, name, o.Partitions); err != nil {
			return "", err
		}
		topics = append(topics, name)
		return name, nil
	}
	newClient := func() (*kgo.Client, error) {
		return kgo.NewClient(append(slices.Clone(kafkaOpts), relay.ProducerOptions(cfg)...)...)
	}

	progress("measuring the Kafka produce ceiling")
	ceilTopic, err := newTopic("produce-ceiling")
	if err != nil {
		return nil, err
	}
	ceilClient, err := newClient()
	if err != nil {
		return nil, err
	}
	res.CeilingProduce, err = produceCeiling(ctx, ceilClient, ceilTopic, o.Events, o.PayloadBytes, cfg.BatchSize)
	ceilClient.Close()
	if err != nil {
		return nil, err
	}

	cfg.Values = reg
	drain := func(governed bool) (float64, error) {
		kind := "plain"
		if governed {
			kind = "governed"
		}
		topic, err := newTopic(kind)
		if err != nil {
			return 0, err
		}
		if governed {
			ss, err := reg.Register(ctx, topic, schemaType, schemaText, "BACKWARD")
			if err != nil {
				return 0, err
			}
			res.SchemaID = ss.ID
		}
		defer func() { _ = outboxstore.DeleteTopic(context.WithoutCancel(ctx), pool, topic) }()
		if err := fillAnalyzed(ctx, pool, o.Events, topic, o.Assets, o.PayloadBytes); err != nil {
			return 0, err
		}
		client, err := newClient()
		if err != nil {
			return 0, err
		}
		defer client.Close()
		if err := warmUp(ctx, client, topic, []byte(`"warm-up"`)); err != nil {
			return 0, err
		}
		runCtx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		r := relay.New(pool, client, cfg)
		start := time.Now()
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(runCtx) }()
		err = waitDrained(ctx, pool, topic, nil, 0)
		took := time.Since(start)
		stop()
		wg.Wait()
		if err != nil {
			return 0, err
		}
		var failed int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM bridge.outbox WHERE topic = $1 AND status = 'FAILED'`, topic).Scan(&failed); err != nil {
			return 0, err
		}
		if failed > 0 {
			return 0, fmt.Errorf("%d rows of the %s topic were parked as FAILED", failed, kind)
		}
		return float64(o.Events) / took.Seconds(), nil
	}
	for round := 1; round <= o.Rounds; round++ {
		progress(fmt.Sprintf("round %d/%d: draining %d events from an ungoverned topic", round, o.Rounds, o.Events))
		u, err := drain(false)
		if err != nil {
			return nil, err
		}
		progress(fmt.Sprintf("round %d/%d: draining %d events from a governed topic (%s schema)", round, o.Rounds, o.Events, o.Kind))
		g, err := drain(true)
		if err != nil {
			return nil, err
		}
		res.UngovernedDrainRates = append(res.UngovernedDrainRates, u)
		res.GovernedDrainRates = append(res.GovernedDrainRates, g)
	}
	res.UngovernedDrainRate = median(res.UngovernedDrainRates)
	res.GovernedDrainRate = median(res.GovernedDrainRates)
	res.GovernedRatio = res.GovernedDrainRate / res.UngovernedDrainRate

	// The hook's own cost per event, alone.
	payload := append([]byte(`"`), append(bytesOf('x', max(o.PayloadBytes-2, 0)), '"')...)
	plain, gov := topics[len(topics)-2], topics[len(topics)-1]
	if _, err := reg.Register(ctx, gov, schemaType, schemaText, ""); err != nil {
		return nil, err
	}
	res.ValueUngovernedNs = perCall(ctx, reg, plain, payload)
	res.ValueGovernedNs = perCall(ctx, reg, gov, payload)
	return res, nil
}

func bytesOf(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

func perCall(ctx context.Context, reg *schema.Registry, topic string, payload []byte) float64 {
	_, _ = reg.Value(ctx, topic, payload) // the look-up, not timed
	const n = 20000
	start := time.Now()
	for range n {
		_, _ = reg.Value(ctx, topic, payload)
	}
	return float64(time.Since(start).Nanoseconds()) / n
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
