// Package schema governs topics with a Confluent-compatible schema registry.
//
// A topic is governed when the registry has a subject named after it under
// the TopicNameStrategy that Confluent's serializers and deserializers use:
// "<topic>-value". For a governed topic:
//
//   - outbox.Enqueue and outbox.EnqueueBatch (with outbox.Schemas set to a
//     *Registry) refuse a payload that does not validate against the subject's
//     latest schema, with an error naming the schema, the path and the rule;
//   - the relay validates what was enqueued through plain SQL the same way and
//     parks a payload that does not validate as FAILED at its first try;
//   - the Kafka record's value carries the Confluent wire format: byte 0 is
//     the magic 0, bytes 1-4 the schema id (big-endian), then the JSON payload
//     as stored (JSON Schema) or the payload written as Avro binary (Avro);
//     Registry.DecodeValue reads either back to the JSON.
//
// Ungoverned topics are untouched: their cost is one cache look-up.
//
// The latest schema of each topic is cached and looked up again after
// Config.RefreshInterval, so a schema registered while the bridge runs is in
// force within that interval, without a restart. JSON Schema and Avro
// subjects are supported (an Avro subject's JSON payloads are written as
// Avro binary, see avro.go); a subject of another type (PROTOBUF) is refused
// with an error saying so, never passed through unvalidated.
package schema

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/twmb/franz-go/pkg/sr"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// SubjectSuffix makes a topic's subject (Confluent's TopicNameStrategy for
// record values).
const SubjectSuffix = "-value"

// Subject is the registry subject that governs topic.
func Subject(topic string) string { return topic + SubjectSuffix }

// ErrViolation is wrapped by every *ViolationError.
var ErrViolation = errors.New("payload does not match the topic's schema")

// ErrUnavailable is wrapped by the error of a look-up the registry could
// not answer (unreachable, timed out, a server error or 429): nothing is
// wrong with the record, so its reader waits and asks again instead of
// dead-lettering it. A registry that answers "not found" is an answer.
var ErrUnavailable = errors.New("schema registry unavailable")

// unavailable tells a registry that could not answer from one that refused.
func unavailable(err error) bool {
	var re *sr.ResponseError
	if errors.As(err, &re) {
		return re.StatusCode >= 500 || re.StatusCode == http.StatusTooManyRequests
	}
	return true
}

// ViolationError says why a payload was refused: the schema (subject,
// version, id), where in the payload (a JSON pointer) and which rule.
type ViolationError struct {
	Topic    string
	Subject  string
	Version  int
	SchemaID int
	// Path is the JSON pointer of the offending value ("" for the payload
	// itself).
	Path string
	// Rule is the schema keyword that failed ("type", "required", ...), or
	// "json" when the payload is not JSON, or "schema-type" when the subject's
	// schema type is not supported.
	Rule    string
	Message string
}

func (e *ViolationError) Error() string {
	path := e.Path
	if path == "" {
		path = "/"
	}
	return fmt.Sprintf("payload does not match schema %s version %d (id %d): at %s: rule %q: %s",
		e.Subject, e.Version, e.SchemaID, path, e.Rule, e.Message)
}

func (e *ViolationError) Unwrap() error { return ErrViolation }

// Config configures a Registry.
type Config struct {
	// URL is the registry's Confluent-compatible API, e.g.
	// http://127.0.0.1:8081/apis/ccompat/v7 for Apicurio Registry. Required.
	URL string
	// RefreshInterval is how long a topic's latest schema (or the fact that
	// it has none) is used before it is looked up again. Default 5s.
	RefreshInterval time.Duration
	// Timeout bounds one registry request. Default 10s.
	Timeout time.Duration
}

// WithDefaults fills in the defaults.
func (c Config) WithDefaults() Config {
	c.RefreshInterval = cmp.Or(c.RefreshInterval, 5*time.Second)
	c.Timeout = cmp.Or(c.Timeout, 10*time.Second)
	return c
}

// Registry validates and frames payloads of governed topics. Safe for
// concurrent use.
type Registry struct {
	cfg       Config
	client    *sr.Client
	transport *http.Transport

	mu     sync.Mutex
	topics map[string]*topicEntry
	byID   map[int]*compiled
}

// topicEntry is one topic's cached state. The refresh lock is held by the
// one caller that looks the topic up again; the others use the state they
// find meanwhile (a topic never seen waits for the first look-up).
type topicEntry struct {
	refresh sync.Mutex
	state   atomic.Pointer[topicState]
}

type topicState struct {
	schema  *compiled // nil: the topic is not governed
	fetched time.Time
}

// compiled is one registered schema, ready to validate.
type compiled struct {
	id      int
	subject string
	version int
	typ     sr.SchemaType
	text    string
	schema  *jsonschema.Schema // nil when typ is not JSON
	avro    *avroCodec         // nil when typ is not AVRO
	frame   []byte             // magic byte and id: the value's first 5 bytes
}

// New returns a Registry for cfg.URL. It makes no request.
func New(cfg Config) (*Registry, error) {
	cfg = cfg.WithDefaults()
	if cfg.URL == "" {
		return nil, errors.New("schema registry: URL is required")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	cl, err := sr.NewClient(sr.URLs(strings.TrimRight(cfg.URL, "/")),
		sr.HTTPClient(&http.Client{Timeout: cfg.Timeout, Transport: tr}),
		sr.UserAgent("outbox-bridge"))
	if err != nil {
		return nil, fmt.Errorf("schema registry %s: %w", cfg.URL, err)
	}
	return &Registry{cfg: cfg, client: cl, transport: tr, topics: map[string]*topicEntry{}, byID: map[int]*compiled{}}, nil
}

// Close closes the registry client's idle connections.
func (r *Registry) Close() { r.transport.CloseIdleConnections() }

// Client is the underlying franz-go registry client.
func (r *Registry) Client() *sr.Client { return r.client }

// URL is the registry's API address.
func (r *Registry) URL() string { return r.cfg.URL }

// Validate checks payload against topic's current schema: nil for an
// ungoverned topic or a valid payload, a *ViolationError for an invalid one,
// any other error when the registry cannot be asked (and nothing is cached).
func (r *Registry) Validate(ctx context.Context, topic string, payload []byte) error {
	c, err := r.current(ctx, topic)
	if err != nil || c == nil {
		return err
	}
	return c.validate(topic, payload)
}

// Value is the Kafka record value for payload on topic: payload itself for
// an ungoverned topic; for a governed one, the payload validated and framed
// (magic byte 0, the 4-byte schema id, the JSON). A *ViolationError means the
// payload can never be sent as it is; any other error is the registry's and
// may pass.
func (r *Registry) Value(ctx context.Context, topic string, payload []byte) ([]byte, error) {
	c, err := r.current(ctx, topic)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return payload, nil
	}
	if c.avro != nil {
		return c.encodeAvro(topic, payload)
	}
	if err := c.validate(topic, payload); err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(c.frame)+len(payload))
	return append(append(out, c.frame...), payload...), nil
}

// Unframe splits a value written by Value: the schema id and the JSON
// payload. ok is false for a value without the Confluent framing (an
// ungoverned topic's JSON never starts with the byte 0).
func Unframe(value []byte) (id int, payload []byte, ok bool) {
	if len(value) < 5 || value[0] != 0 {
		return 0, value, false
	}
	var h sr.ConfluentHeader
	id, rest, err := h.DecodeID(value)
	if err != nil {
		return 0, value, false
	}
	return id, rest, true
}

// DecodeValue is the JSON payload of a record value written by Value: the
// value itself when it is not framed; the JSON after the framing for a JSON
// Schema id; the Avro binary read back to JSON (docs/contract.md, "Avro
// subjects") for an Avro schema id, looked up in the registry by id (and
// cached: an id's schema never changes).
func (r *Registry) DecodeValue(ctx context.Context, value []byte) ([]byte, error) {
	id, payload, ok := Unframe(value)
	if !ok {
		return value, nil
	}
	c, err := r.byIDLookup(ctx, id)
	if err != nil {
		return nil, err
	}
	if c.avro == nil {
		return payload, nil
	}
	out, err := c.avro.decode(payload)
	if err != nil {
		return nil, fmt.Errorf("schema id %d: %w", id, err)
	}
	return out, nil
}

func (r *Registry) byIDLookup(ctx context.Context, id int) (*compiled, error) {
	r.mu.Lock()
	c := r.byID[id]
	r.mu.Unlock()
	if c != nil {
		return c, nil
	}
	s, err := r.client.SchemaByID(ctx, id)
	if err != nil {
		if unavailable(err) {
			return nil, fmt.Errorf("schema registry %s: schema id %d: %w: %w", r.cfg.URL, id, ErrUnavailable, err)
		}
		return nil, fmt.Errorf("schema registry %s: schema id %d: %w", r.cfg.URL, id, err)
	}
	return r.compile(sr.SubjectSchema{ID: id, Schema: s})
}

// Invalidate forgets the cached state of topic (all topics when topic is
// ""), so the next use looks it up again: what a register through this
// process calls so its own change is in force at once.
func (r *Registry) Invalidate(topic string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if topic == "" {
		r.topics = map[string]*topicEntry{}
		return
	}
	delete(r.topics, topic)
}

func (r *Registry) entry(topic string) *topicEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.topics[topic]
	if e == nil {
		e = &topicEntry{}
		r.topics[topic] = e
	}
	return e
}

// current is topic's latest schema, nil when the topic is not governed.
func (r *Registry) current(ctx context.Context, topic string) (*compiled, error) {
	e := r.entry(topic)
	st := e.state.Load()
	if st != nil && time.Since(st.fetched) < r.cfg.RefreshInterval {
		return st.schema, nil
	}
	if st != nil {
		// Stale: one caller looks it up again, the others go on with what
		// is cached; a failed look-up keeps the last known state.
		if !e.refresh.TryLock() {
			return st.schema, nil
		}
		defer e.refresh.Unlock()
		if err := r.lookup(ctx, topic, e); err != nil {
			return st.schema, nil
		}
		return e.state.Load().schema, nil
	}
	e.refresh.Lock()
	defer e.refresh.Unlock()
	if st := e.state.Load(); st != nil {
		return st.schema, nil
	}
	if err := r.lookup(ctx, topic, e); err != nil {
		return nil, err
	}
	return e.state.Load().schema, nil
}

// lookup asks the registry for topic's latest schema and stores it in e.
func (r *Registry) lookup(ctx context.Context, topic string, e *topicEntry) error {
	subject := Subject(topic)
	ss, err := r.client.SchemaByVersion(ctx, subject, -1)
	if err != nil {
		var re *sr.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
			e.state.Store(&topicState{fetched: time.Now()})
			return nil
		}
		return fmt.Errorf("schema registry %s: latest schema of %s: %w", r.cfg.URL, subject, err)
	}
	c, err := r.compile(ss)
	if err != nil {
		return err
	}
	e.state.Store(&topicState{schema: c, fetched: time.Now()})
	return nil
}

func (r *Registry) compile(ss sr.SubjectSchema) (*compiled, error) {
	r.mu.Lock()
	c := r.byID[ss.ID]
	r.mu.Unlock()
	if c != nil && c.subject == ss.Subject && c.version == ss.Version {
		return c, nil
	}
	c = &compiled{id: ss.ID, subject: ss.Subject, version: ss.Version, typ: ss.Type, text: ss.Schema.Schema}
	var h sr.ConfluentHeader
	frame, err := h.AppendEncode(nil, ss.ID, nil)
	if err != nil {
		return nil, err
	}
	c.frame = frame
	if ss.Type == sr.TypeJSON {
		sch, err := CompileJSONSchema(ss.Schema.Schema)
		if err != nil {
			return nil, fmt.Errorf("schema %s version %d (id %d): %w", ss.Subject, ss.Version, ss.ID, err)
		}
		c.schema = sch
	}
	if ss.Type == sr.TypeAvro {
		ac, err := compileAvro(ss.Schema.Schema)
		if err != nil {
			return nil, fmt.Errorf("schema %s version %d (id %d): %w", ss.Subject, ss.Version, ss.ID, err)
		}
		c.avro = ac
	}
	r.mu.Lock()
	r.byID[ss.ID] = c
	r.mu.Unlock()
	return c, nil
}

// CompileJSONSchema compiles a JSON Schema document (drafts 4 to 2020-12,
// chosen by its $schema; 2020-12 when it has none).
func CompileJSONSchema(text string) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("JSON Schema is not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("schema.json", doc); err != nil {
		return nil, fmt.Errorf("JSON Schema: %w", err)
	}
	sch, err := c.Compile("schema.json")
	if err != nil {
		return nil, fmt.Errorf("JSON Schema does not compile: %w", err)
	}
	return sch, nil
}

var printer = message.NewPrinter(language.English)

func (c *compiled) violation(topic, path, rule, msg string) *ViolationError {
	return &ViolationError{Topic: topic, Subject: c.subject, Version: c.version, SchemaID: c.id, Path: path, Rule: rule, Message: msg}
}

func (c *compiled) validate(topic string, payload []byte) error {
	if c.avro != nil {
		_, err := c.encodeAvro(topic, payload)
		return err
	}
	if c.schema == nil {
		return c.violation(topic, "", "schema-type",
			fmt.Sprintf("the subject's schema type is %s; the bridge validates and frames JSON Schema and Avro subjects only", c.typ))
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return c.violation(topic, "", "json", "payload is not valid JSON: "+err.Error())
	}
	err = c.schema.Validate(inst)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return c.violation(topic, "", "validate", err.Error())
	}
	leaf := firstLeaf(ve)
	path := ""
	for _, tok := range leaf.InstanceLocation {
		path += "/" + strings.ReplaceAll(strings.ReplaceAll(tok, "~", "~0"), "/", "~1")
	}
	return c.violation(topic, path, strings.Join(leaf.ErrorKind.KeywordPath(), "/"), leaf.ErrorKind.LocalizedString(printer))
}

// encodeAvro is the framed Avro binary of the JSON payload, or a
// *ViolationError naming the field that does not fit.
func (c *compiled) encodeAvro(topic string, payload []byte) ([]byte, error) {
	out, err := c.avro.encode(c.frame, payload)
	if err != nil {
		var ae *avroError
		if errors.As(err, &ae) {
			return nil, c.violation(topic, ae.path, ae.rule, ae.msg)
		}
		return nil, c.violation(topic, "", "avro", err.Error())
	}
	return out, nil
}

// firstLeaf is the first innermost cause: the failed rule itself, not the
// "doesn't validate with schema.json#" wrappers around it.
func firstLeaf(ve *jsonschema.ValidationError) *jsonschema.ValidationError {
	for len(ve.Causes) > 0 {
		ve = ve.Causes[0]
	}
	return ve
}

// SchemaType parses a schema type name as the CLI and the admin API take it.
func SchemaType(s string) (sr.SchemaType, error) {
	switch strings.ToUpper(s) {
	case "", "JSON":
		return sr.TypeJSON, nil
	case "AVRO":
		return sr.TypeAvro, nil
	case "PROTOBUF":
		return sr.TypeProtobuf, nil
	}
	return 0, fmt.Errorf("schema type %q: want JSON, AVRO or PROTOBUF", s)
}

// Register registers text as the next version of topic's subject (after
// checking, for a JSON Schema, that it compiles), setting the subject's
// compatibility level first when compatibility is not "". An incompatible
// schema is refused by the registry; its reason is in the error.
func (r *Registry) Register(ctx context.Context, topic string, typ sr.SchemaType, text, compatibility string) (sr.SubjectSchema, error) {
	subject := Subject(topic)
	if typ == sr.TypeJSON {
		if _, err := CompileJSONSchema(text); err != nil {
			return sr.SubjectSchema{}, fmt.Errorf("%s: %w", subject, err)
		}
	}
	if typ == sr.TypeAvro {
		if _, err := compileAvro(text); err != nil {
			return sr.SubjectSchema{}, fmt.Errorf("%s: %w", subject, err)
		}
	}
	registerMu.Lock()
	defer registerMu.Unlock()
	if compatibility != "" {
		var lvl sr.CompatibilityLevel
		if err := lvl.UnmarshalText([]byte(strings.ToUpper(compatibility))); err != nil {
			return sr.SubjectSchema{}, fmt.Errorf("compatibility %q: %w", compatibility, err)
		}
		err := retryStorage(ctx, func() error {
			for _, res := range r.client.SetCompatibility(ctx, sr.SetCompatibility{Level: lvl}, subject) {
				if res.Err != nil {
					return res.Err
				}
			}
			return nil
		})
		if err != nil {
			return sr.SubjectSchema{}, fmt.Errorf("set compatibility of %s: %w", subject, err)
		}
	}
	var ss sr.SubjectSchema
	err := retryStorage(ctx, func() (err error) {
		ss, err = r.client.CreateSchema(ctx, subject, sr.Schema{Schema: text, Type: typ})
		return err
	})
	if err != nil {
		return sr.SubjectSchema{}, fmt.Errorf("register %s: %w", subject, err)
	}
	r.Invalidate(topic)
	return ss, nil
}

// registerMu serialises this process's registrations: Apicurio Registry on
// its in-memory H2 fails two concurrent writes with a lock conflict
// ("Concurrent update in table SEQUENCES").
var registerMu sync.Mutex

// retryStorage runs f again (up to 4 tries) while the registry answers
// with a server error: a write that lost a storage lock conflict to another
// writer. Both writes are idempotent (the same schema registered twice is
// one version). A refusal (4xx, e.g. 409 incompatible) is returned at once.
func retryStorage(ctx context.Context, f func() error) error {
	var err error
	for try := 1; ; try++ {
		err = f()
		var re *sr.ResponseError
		if err == nil || try == 4 || !errors.As(err, &re) || re.StatusCode < 500 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(try) * 200 * time.Millisecond):
		}
	}
}

// Topics lists the governed topics (subjects ending in "-value").
func (r *Registry) Topics(ctx context.Context) ([]string, error) {
	subjects, err := r.client.Subjects(ctx)
	if err != nil {
		return nil, fmt.Errorf("schema registry %s: subjects: %w", r.cfg.URL, err)
	}
	var topics []string
	for _, s := range subjects {
		if t, ok := strings.CutSuffix(s, SubjectSuffix); ok && t != "" {
			topics = append(topics, t)
		}
	}
	return topics, nil
}

// Version is one registered version of a topic's schema, as the CLI and the
// admin API show it.
type Version struct {
	Topic   string `json:"topic"`
	Subject string `json:"subject"`
	Version int    `json:"version"`
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Schema  string `json:"schema"`
}

func versionOf(topic string, ss sr.SubjectSchema) Version {
	return Version{Topic: topic, Subject: ss.Subject, Version: ss.Version, ID: ss.ID, Type: ss.Type.String(), Schema: ss.Schema.Schema}
}

// VersionOf is ss, registered for topic, as a Version.
func VersionOf(topic string, ss sr.SubjectSchema) Version { return versionOf(topic, ss) }

// ErrNotGoverned is returned (wrapped) by History for a topic without a
// subject.
var ErrNotGoverned = errors.New("topic is not governed (no subject in the schema registry)")

// List is the latest version of every governed topic.
func (r *Registry) List(ctx context.Context) ([]Version, error) {
	topics, err := r.Topics(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Version, 0, len(topics))
	for _, t := range topics {
		ss, err := r.client.SchemaByVersion(ctx, Subject(t), -1)
		if err != nil {
			return nil, fmt.Errorf("schema registry %s: latest version of %s: %w", r.cfg.URL, Subject(t), err)
		}
		out = append(out, versionOf(t, ss))
	}
	return out, nil
}

// History is every registered version of topic's schema, oldest first;
// ErrNotGoverned when the topic has no subject.
func (r *Registry) History(ctx context.Context, topic string) ([]Version, error) {
	ss, err := r.client.Schemas(ctx, Subject(topic))
	if err != nil {
		var re *sr.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
			return nil, fmt.Errorf("%s: %w", topic, ErrNotGoverned)
		}
		return nil, fmt.Errorf("schema registry %s: %s: %w", r.cfg.URL, Subject(topic), err)
	}
	out := make([]Version, 0, len(ss))
	for _, s := range ss {
		out = append(out, versionOf(topic, s))
	}
	return out, nil
}
