// Package config reads the bridge's configuration from environment variables
// (github.com/caarlos0/env/v11). There is one struct per component; every field
// documents its variable and default. Load errors name the variable and what is
// wrong in one line, so `bridge` can exit 2 with it instead of a stack trace.
package config

import (
	"errors"
	"fmt"
	"iter"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/keyring"
	"github.com/outboxbridge/bridge/internal/topicname"
)

// Log configures logging.
type Log struct {
	// LOG_LEVEL: debug, info, warn or error. Default info.
	Level string `env:"LOG_LEVEL" envDefault:"info"`
	// LOG_FORMAT: text or json. Default text.
	Format string `env:"LOG_FORMAT" envDefault:"text"`
}

func (c Log) validate() error {
	if err := oneOf("LOG_LEVEL", c.Level, strings.ToLower(c.Level), "must be one of debug, info, warn, error",
		"debug", "info", "warn", "warning", "error"); err != nil {
		return err
	}
	return oneOf("LOG_FORMAT", c.Format, c.Format, "must be text or json", "text", "json")
}

// Database configures the PostgreSQL connection.
type Database struct {
	// DATABASE_URL: PostgreSQL connection string (URL or key=value form).
	// Required.
	URL string `env:"DATABASE_URL,required" secret:"url"`
	// DATABASE_CONNECT_TIMEOUT: how long a long-running command (relay,
	// consume, deliver, run) keeps retrying its first connections to
	// PostgreSQL and Kafka, with /healthz up and /readyz not ready, before it
	// exits 1; 0 waits forever. A process started during a database failover
	// then waits it out instead of exiting into a supervisor's restart loop.
	// Operator commands try once, for at most 10s (or this, if shorter).
	// Default 3m.
	ConnectTimeout time.Duration `env:"DATABASE_CONNECT_TIMEOUT" envDefault:"3m"`
	// DATABASE_MAX_CONNS: pool size. Default 10.
	MaxConns int32 `env:"DATABASE_MAX_CONNS" envDefault:"10"`
}

func (c Database) validate() error {
	if strings.TrimSpace(c.URL) == "" {
		return fieldError("DATABASE_URL", "", "must not be empty")
	}
	if strings.Contains(c.URL, "://") {
		u, err := url.Parse(c.URL)
		if err != nil {
			return fieldError("DATABASE_URL", RedactURL(c.URL), "is not a valid URL")
		}
		if u.Scheme != "postgres" && u.Scheme != "postgresql" {
			return fieldError("DATABASE_URL", RedactURL(c.URL), "scheme must be postgres:// or postgresql://")
		}
	}
	// Parsed here as Connect parses it, so every command (bridge config
	// included) refuses 'not a url' with exit 2 before connecting.
	if _, err := c.PoolConfig(); err != nil {
		return err
	}
	if c.ConnectTimeout < 0 {
		return fieldError("DATABASE_CONNECT_TIMEOUT", c.ConnectTimeout.String(), "must not be negative (0 waits forever)")
	}
	if c.MaxConns < 2 {
		return fieldError("DATABASE_MAX_CONNS", fmt.Sprint(c.MaxConns), "must be at least 2")
	}
	return nil
}

// PoolConfig parses DATABASE_URL (URL or key=value form) as pgxpool does.
// A parse error names the variable and never echoes the password.
func (c Database) PoolConfig() (*pgxpool.Config, error) {
	pcfg, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		return nil, fieldError("DATABASE_URL", RedactURL(c.URL), "cannot be parsed: "+redactParseError(err))
	}
	return pcfg, nil
}

func redactParseError(err error) string {
	// pgconn's parse errors quote the DSN; do not echo it back.
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		if u := errors.Unwrap(pe); u != nil {
			return u.Error()
		}
		return "invalid connection string"
	}
	return err.Error()
}

// checkPort says what is wrong with a TCP port, or "" when it is one: a
// number from 1 (0 too when zeroOK: any free port) to 65535. Checked here
// so HTTP_ADDR=:99999 is refused with exit 2 instead of failing at listen.
func checkPort(port string, zeroOK bool) string {
	n, err := strconv.Atoi(port)
	switch {
	case err != nil || port == "" || strings.TrimLeft(port, "0123456789") != "":
		return fmt.Sprintf("port %q is not a number", port)
	case n > 65535:
		return fmt.Sprintf("port %d is out of range (at most 65535)", n)
	case n == 0 && !zeroOK:
		return "port 0 is not a port to connect to"
	}
	return ""
}

// Kafka configures the connection to the Kafka cluster, shared by every
// component that talks to it.
type Kafka struct {
	// KAFKA_BROKERS: comma-separated seed brokers, host:port. Required where
	// Kafka is used.
	Brokers []string `env:"KAFKA_BROKERS" envSeparator:","`
	// KAFKA_CLIENT_ID: client id sent to the brokers. Default outbox-bridge.
	ClientID string `env:"KAFKA_CLIENT_ID" envDefault:"outbox-bridge"`
	// KAFKA_TLS: use TLS to the brokers. Default false.
	TLS bool `env:"KAFKA_TLS" envDefault:"false"`
	// KAFKA_TLS_CA_FILE: PEM CA bundle to verify brokers; empty: system roots.
	TLSCAFile string `env:"KAFKA_TLS_CA_FILE"`
	// KAFKA_TLS_CERT_FILE / KAFKA_TLS_KEY_FILE: client certificate for mTLS.
	TLSCertFile string `env:"KAFKA_TLS_CERT_FILE"`
	TLSKeyFile  string `env:"KAFKA_TLS_KEY_FILE"`
	// KAFKA_TLS_SERVER_NAME: overrides the server name checked in the broker's
	// certificate. Default: the broker host.
	TLSServerName string `env:"KAFKA_TLS_SERVER_NAME"`
	// KAFKA_TLS_INSECURE_SKIP_VERIFY: do not verify broker certificates (tests
	// only). Default false.
	TLSInsecureSkipVerify bool `env:"KAFKA_TLS_INSECURE_SKIP_VERIFY" envDefault:"false"`
	// KAFKA_SASL_MECHANISM: empty (none), PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	SASLMechanism string `env:"KAFKA_SASL_MECHANISM"`
	// KAFKA_SASL_USERNAME / KAFKA_SASL_PASSWORD: SASL credentials.
	SASLUsername string `env:"KAFKA_SASL_USERNAME" secret:"value"`
	SASLPassword string `env:"KAFKA_SASL_PASSWORD" secret:"value"`
	// KAFKA_LOG_LEVEL: the Kafka client's own log lines: debug, info, warn,
	// error or none, each logged at its own level (LOG_LEVEL still applies).
	// Default: every client level one step down on ours (its INFO, the
	// heartbeats and rebalances, is our DEBUG).
	LogLevel string `env:"KAFKA_LOG_LEVEL"`
}

// Validate checks the Kafka settings; requireBrokers is true for commands
// that talk to Kafka.
func (c Kafka) Validate(requireBrokers bool) error {
	if requireBrokers && len(c.Brokers) == 0 {
		return fieldError("KAFKA_BROKERS", "", "is required (comma-separated host:port list)")
	}
	for _, b := range c.Brokers {
		b = strings.TrimSpace(b)
		host, port, err := net.SplitHostPort(b)
		if err != nil || host == "" || port == "" {
			return fieldError("KAFKA_BROKERS", strings.Join(c.Brokers, ","), fmt.Sprintf("broker %q is not host:port", b))
		}
		if p := checkPort(port, false); p != "" {
			return fieldError("KAFKA_BROKERS", strings.Join(c.Brokers, ","), fmt.Sprintf("broker %q: %s", b, p))
		}
	}
	if err := oneOf("KAFKA_LOG_LEVEL", c.LogLevel, strings.ToLower(c.LogLevel), "must be one of debug, info, warn, error, none",
		"", "debug", "info", "warn", "warning", "error", "none"); err != nil {
		return err
	}
	if err := oneOf("KAFKA_SASL_MECHANISM", c.SASLMechanism, c.SASLMechanism, "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
		"", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"); err != nil {
		return err
	}
	if c.SASLMechanism != "" && (c.SASLUsername == "" || c.SASLPassword == "") {
		return fieldError("KAFKA_SASL_USERNAME", "", "KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD are required with KAFKA_SASL_MECHANISM")
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return fieldError("KAFKA_TLS_CERT_FILE", c.TLSCertFile, "KAFKA_TLS_CERT_FILE and KAFKA_TLS_KEY_FILE must be set together")
	}
	return nil
}

// HTTP configures the operational HTTP server (health, metrics, admin API,
// console).
type HTTP struct {
	// HTTP_ADDR: listen address for /healthz, /readyz, /metrics and the admin
	// API; "off" disables the server. Default 127.0.0.1:8080.
	Addr string `env:"HTTP_ADDR" envDefault:"127.0.0.1:8080"`
	// ADMIN_TOKEN: bearer token for the admin API; empty serves only health
	// and metrics.
	AdminToken string `env:"ADMIN_TOKEN" secret:"value"`
	// JAEGER_QUERY_URL: Jaeger query service the console reads traces from
	// (GET /api/traces/<id>) to draw them itself, e.g. http://127.0.0.1:16686;
	// empty: the console shows trace ids without drawing them.
	JaegerQueryURL string `env:"JAEGER_QUERY_URL"`
	// JAEGER_UI_URL: a Jaeger UI to link trace pages to (<url>/trace/<id>);
	// empty: no link (the Jaeger scripts/services-up.sh builds has no UI).
	JaegerUIURL string `env:"JAEGER_UI_URL"`
	// READY_STALL_TIMEOUT: a consumer or deliverer that made no progress
	// for this long while work waits for it reports not ready on /readyz
	// (check consume_progress, deliver_progress or fast_lane_progress); 0
	// turns the check off.
	// Default 5m.
	ReadyStallTimeout time.Duration `env:"READY_STALL_TIMEOUT" envDefault:"5m"`
}

// HTTPOff is the HTTP_ADDR value that disables the ops server (an empty
// value cannot: the env library applies the default to it).
const HTTPOff = "off"

func (c HTTP) validate() error {
	if c.Addr == "" || c.Addr == HTTPOff {
		return nil
	}
	_, port, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return fieldError("HTTP_ADDR", c.Addr, "is not host:port")
	}
	if p := checkPort(port, true); p != "" {
		return fieldError("HTTP_ADDR", c.Addr, p)
	}
	for _, v := range []struct{ name, value string }{{"JAEGER_QUERY_URL", c.JaegerQueryURL}, {"JAEGER_UI_URL", c.JaegerUIURL}} {
		if v.value == "" {
			continue
		}
		if u, err := url.Parse(v.value); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fieldError(v.name, v.value, "must be an http:// or https:// URL")
		}
	}
	return nil
}

// Relay configures `bridge relay`.
type Relay struct {
	// RELAY_MAX_ATTEMPTS: failed sends that belong to a row before it is
	// parked as FAILED. Default 10.
	MaxAttempts int `env:"RELAY_MAX_ATTEMPTS" envDefault:"10"`
	// RELAY_BACKOFF_BASE: delay before the 2nd attempt; doubles per attempt.
	// Default 7s, which spreads 10 attempts over about an hour.
	BackoffBase time.Duration `env:"RELAY_BACKOFF_BASE" envDefault:"7s"`
	// RELAY_BACKOFF_MAX: cap on one backoff delay. Default 30m.
	BackoffMax time.Duration `env:"RELAY_BACKOFF_MAX" envDefault:"30m"`
	// RELAY_BATCH_SIZE: rows claimed and produced per cycle. Default 1000.
	BatchSize int `env:"RELAY_BATCH_SIZE" envDefault:"1000"`
	// RELAY_BATCH_BYTES: payload bytes claimed per cycle at most (a cycle
	// always takes at least one row), so memory is bounded by bytes, not by
	// rows. Default 16777216 (16 MiB).
	BatchBytes int `env:"RELAY_BATCH_BYTES" envDefault:"16777216"`
	// RELAY_POLL_INTERVAL: fallback poll when no NOTIFY arrives. Default 1s.
	PollInterval time.Duration `env:"RELAY_POLL_INTERVAL" envDefault:"1s"`
	// RELAY_LEASE_TIMEOUT: how long a replica's lane lease lasts without
	// renewal; a dead replica's lanes move after at most this. Default 15s.
	LeaseTimeout time.Duration `env:"RELAY_LEASE_TIMEOUT" envDefault:"15s"`
	// RELAY_PRODUCE_TIMEOUT: bound on one produce attempt, so a send the
	// client would retry forever is counted. Default 30s.
	ProduceTimeout time.Duration `env:"RELAY_PRODUCE_TIMEOUT" envDefault:"30s"`
	// RELAY_RETENTION: How long sent events stay readable at least: a table of the outbox log is truncated once every relay lane passed it and this much time has passed since it stopped taking events. Default 24h.
	Retention time.Duration `env:"RELAY_RETENTION" envDefault:"24h"`
	// RELAY_MAX_MESSAGE_BYTES: a payload larger than this is parked at once.
	// Default 1000000 (Kafka's default max.message.bytes).
	MaxMessageBytes int `env:"RELAY_MAX_MESSAGE_BYTES" envDefault:"1000000"`
	// RELAY_CLOUDEVENTS: off, or binary to add the CloudEvents Kafka
	// binding's binary-mode headers (ce_specversion, ce_id = dedup id,
	// ce_source, ce_type = event type, ce_time, ce_subject = asset id) to
	// every record, so CloudEvents consumers read them natively. Default off.
	CloudEvents string `env:"RELAY_CLOUDEVENTS" envDefault:"off"`
	// RELAY_CLOUDEVENTS_SOURCE: the ce_source of every record (a URI
	// reference naming the producer). Default outbox-bridge.
	CloudEventsSource string `env:"RELAY_CLOUDEVENTS_SOURCE" envDefault:"outbox-bridge"`
}

// CloudEventsBinary is the RELAY_CLOUDEVENTS value that turns the
// CloudEvents headers on.
const CloudEventsBinary = "binary"

func (c Relay) validate() error {
	switch {
	case c.MaxAttempts < 1:
		return fieldError("RELAY_MAX_ATTEMPTS", fmt.Sprint(c.MaxAttempts), "must be at least 1")
	case c.BackoffBase <= 0:
		return fieldError("RELAY_BACKOFF_BASE", c.BackoffBase.String(), "must be positive")
	case c.BackoffMax < c.BackoffBase:
		return fieldError("RELAY_BACKOFF_MAX", c.BackoffMax.String(), "must be at least RELAY_BACKOFF_BASE")
	case c.BatchSize < 1 || c.BatchSize > 100000:
		return fieldError("RELAY_BATCH_SIZE", fmt.Sprint(c.BatchSize), "must be between 1 and 100000")
	case c.BatchBytes < 1:
		return fieldError("RELAY_BATCH_BYTES", fmt.Sprint(c.BatchBytes), "must be at least 1")
	case c.PollInterval <= 0:
		return fieldError("RELAY_POLL_INTERVAL", c.PollInterval.String(), "must be positive")
	case c.LeaseTimeout < time.Second:
		return fieldError("RELAY_LEASE_TIMEOUT", c.LeaseTimeout.String(), "must be at least 1s")
	case c.ProduceTimeout < time.Second:
		return fieldError("RELAY_PRODUCE_TIMEOUT", c.ProduceTimeout.String(), "must be at least 1s (franz-go's minimum record timeout)")
	case c.Retention <= 0:
		return fieldError("RELAY_RETENTION", c.Retention.String(), "must be positive")
	case c.MaxMessageBytes < 1:
		return fieldError("RELAY_MAX_MESSAGE_BYTES", fmt.Sprint(c.MaxMessageBytes), "must be positive")
	case c.CloudEvents != "off" && c.CloudEvents != CloudEventsBinary:
		return fieldError("RELAY_CLOUDEVENTS", c.CloudEvents, "must be off or binary (structured mode is not supported: it would change the record's value)")
	case c.CloudEvents == CloudEventsBinary:
		if err := cloudEventsSourceProblem(c.CloudEventsSource); err != "" {
			return fieldError("RELAY_CLOUDEVENTS_SOURCE", c.CloudEventsSource, err)
		}
	}
	return nil
}

// cloudEventsSourceProblem says what is wrong with a ce_source ("" when
// nothing): the spec requires a URI reference (an empty value takes the
// default, like every variable), and a header value
// with control characters would not survive every consumer.
func cloudEventsSourceProblem(src string) string {
	if strings.IndexFunc(src, func(r rune) bool { return r < 0x21 || r == 0x7f }) >= 0 {
		return "must not contain spaces or control characters (it is a URI reference)"
	}
	if _, err := url.Parse(src); err != nil {
		return "must be a URI reference: " + err.Error()
	}
	return ""
}

// Consumer configures `bridge consume`.
type Consumer struct {
	// CONSUMER_GROUP: Kafka consumer group. Default outbox-bridge.
	Group string `env:"CONSUMER_GROUP" envDefault:"outbox-bridge"`
	// CONSUMER_TOPICS: comma-separated topics to consume; a value starting
	// with ~ is a regular expression. Required for `bridge consume`, and for
	// `bridge deliver` and `bridge run` with WEBHOOK_FAST_LANE (the default).
	Topics []string `env:"CONSUMER_TOPICS" envSeparator:","`
	// CONSUMER_DEDUP_WINDOW: inbox rows older than this are pruned. Default 168h (7 days).
	DedupWindow time.Duration `env:"CONSUMER_DEDUP_WINDOW" envDefault:"168h"`
	// CONSUMER_MAX_POLL_RECORDS: records per poll, one transaction each. Default 500.
	MaxPollRecords int `env:"CONSUMER_MAX_POLL_RECORDS" envDefault:"500"`
	// CONSUMER_SESSION_TIMEOUT: how long the group coordinator keeps a
	// member that stopped heartbeating (a SIGKILLed or cut-off consumer)
	// before handing its partitions to the others, so the stall after a
	// crash is about this long. Must lie within the broker's
	// group.min.session.timeout.ms and group.max.session.timeout.ms (6s and
	// 30m by default). Classic protocol only: with
	// CONSUMER_GROUP_PROTOCOL=consumer the broker's
	// group.consumer.session.timeout.ms decides (45s by default). Shorter
	// is not free: a live member whose heartbeats stall this long (CPU
	// starvation, a paused VM, a network blip) is evicted and its group
	// rebalances (its uncommitted batch is read again and dropped by the
	// inbox). Measured, a SIGKILLed member's partitions move after 6.0–6.8s
	// with 6s (the broker's minimum) and up to 9.1s with 7s under load 40,
	// so 6s keeps the stall within 10s on a loaded machine (10s gave
	// 10.4–11.6s). Raise it where members can be starved of CPU for
	// seconds. Default 6s.
	SessionTimeout time.Duration `env:"CONSUMER_SESSION_TIMEOUT" envDefault:"6s"`
	// CONSUMER_REBALANCE_TIMEOUT: how long members may take to rejoin once a
	// rebalance began. The batch in flight holds the rebalance until it is
	// committed, so it must finish within this; a member that does not is
	// removed and its batch is redelivered (and deduplicated). Default 30s.
	RebalanceTimeout time.Duration `env:"CONSUMER_REBALANCE_TIMEOUT" envDefault:"30s"`
	// CONSUMER_INSTANCE_ID: static group membership (Kafka's
	// group.instance.id), unique per replica, stable across its restarts
	// (e.g. a StatefulSet's pod name): a replica restarted within
	// CONSUMER_SESSION_TIMEOUT gets its partitions back without a rebalance.
	// A static member does not leave the group when it stops, so its
	// partitions pause until it is back or the session times out. Empty
	// (the default): dynamic membership.
	InstanceID string `env:"CONSUMER_INSTANCE_ID"`
	// CONSUMER_GROUP_PROTOCOL: classic (JoinGroup/SyncGroup, the members
	// assign partitions) or consumer (KIP-848: the broker assigns them and
	// reconciles member by member, with no stop-the-world rebalance; needs
	// Kafka 4.0+, and an older broker gets classic). Default classic.
	GroupProtocol string `env:"CONSUMER_GROUP_PROTOCOL" envDefault:"classic"`
}

// Validate checks the consumer settings; requireTopics is true for commands
// that consume.
func (c Consumer) Validate(requireTopics bool) error {
	if c.Group == "" {
		return fieldError("CONSUMER_GROUP", "", "must not be empty")
	}
	if requireTopics && len(c.Topics) == 0 {
		return fieldError("CONSUMER_TOPICS", "", "is required (comma-separated topic list)")
	}
	if c.DedupWindow <= 0 {
		return fieldError("CONSUMER_DEDUP_WINDOW", c.DedupWindow.String(), "must be positive")
	}
	if c.MaxPollRecords < 1 {
		return fieldError("CONSUMER_MAX_POLL_RECORDS", fmt.Sprint(c.MaxPollRecords), "must be positive")
	}
	if c.SessionTimeout < time.Second {
		return fieldError("CONSUMER_SESSION_TIMEOUT", c.SessionTimeout.String(), "must be at least 1s")
	}
	if c.RebalanceTimeout < time.Second {
		return fieldError("CONSUMER_REBALANCE_TIMEOUT", c.RebalanceTimeout.String(), "must be at least 1s")
	}
	return oneOf("CONSUMER_GROUP_PROTOCOL", c.GroupProtocol, c.GroupProtocol, "must be classic or consumer", "classic", "consumer")
}

// Webhook configures `bridge deliver` and subscription management.
type Webhook struct {
	// WEBHOOK_RETRY_SCHEDULE: delays before each retry, comma-separated Go
	// durations; after the last one the delivery is dead. Default
	// 0s,5s,5m,30m,2h,5h,10h,10h (Svix's schedule), each with ±20% jitter.
	RetrySchedule []time.Duration `env:"WEBHOOK_RETRY_SCHEDULE" envSeparator:"," envDefault:"0s,5s,5m,30m,2h,5h,10h,10h"`
	// WEBHOOK_DISABLE_AFTER: consecutive dead deliveries that disable a
	// subscription. Default 5.
	DisableAfter int `env:"WEBHOOK_DISABLE_AFTER" envDefault:"5"`
	// WEBHOOK_BREAKER_AFTER: a subscription whose attempts failed on this
	// many different streams in a row (no 2xx between), and that had no 2xx
	// for WEBHOOK_BREAKER_PROBE_INTERVAL, is probed: the slow
	// lane sends its due heads one at a time, at most one per
	// WEBHOOK_BREAKER_PROBE_INTERVAL, until one succeeds; waiting behind a
	// probe charges no attempt. 0: never. Default 10.
	BreakerAfter int `env:"WEBHOOK_BREAKER_AFTER" envDefault:"10"`
	// WEBHOOK_BREAKER_PROBE_INTERVAL: while a subscription is probed, at most
	// one of its due heads is sent per interval. Default 1s.
	BreakerProbeInterval time.Duration `env:"WEBHOOK_BREAKER_PROBE_INTERVAL" envDefault:"1s"`
	// WEBHOOK_TIMEOUT: timeout of one HTTP attempt. Default 15s.
	Timeout time.Duration `env:"WEBHOOK_TIMEOUT" envDefault:"15s"`
	// WEBHOOK_LEASE: a delivery in flight longer than this goes back to
	// pending (keeping its attempt). Default 60s.
	Lease time.Duration `env:"WEBHOOK_LEASE" envDefault:"60s"`
	// WEBHOOK_ALLOWED_CIDRS: comma-separated CIDRs exempt from the SSRF block
	// list (e.g. 127.0.0.0/8 for local tests). Default none.
	AllowedCIDRs []string `env:"WEBHOOK_ALLOWED_CIDRS" envSeparator:","`
	// WEBHOOK_ALLOW_HTTP: accept http:// subscription URLs. Default false.
	AllowHTTP bool `env:"WEBHOOK_ALLOW_HTTP" envDefault:"false"`
	// WEBHOOK_SECRET_GRACE: how long a rotated-out secret keeps signing.
	// Default 24h.
	SecretGrace time.Duration `env:"WEBHOOK_SECRET_GRACE" envDefault:"24h"`
	// WEBHOOK_MAX_IN_FLIGHT_PER_SUBSCRIPTION: deliveries of one subscription
	// in flight at once (sending, or waiting for their outcome to be
	// written). Default 64.
	MaxInFlightPerSubscription int `env:"WEBHOOK_MAX_IN_FLIGHT_PER_SUBSCRIPTION" envDefault:"64"`
	// WEBHOOK_WORKERS: concurrent HTTP requests in total. Default 128.
	Workers int `env:"WEBHOOK_WORKERS" envDefault:"128"`
	// WEBHOOK_CLAIM_LOOPS: claim statements one deliverer may run at once,
	// each for its own share of the subscriptions. Default 4.
	ClaimLoops int `env:"WEBHOOK_CLAIM_LOOPS" envDefault:"4"`
	// WEBHOOK_CLAIM_BYTES: payload bytes one deliverer holds at most
	// (claimed, in a request or waiting for its outcome; a claim always takes
	// at least one row), so memory is bounded by bytes, not by rows. Default
	// 16777216 (16 MiB).
	ClaimBytes int `env:"WEBHOOK_CLAIM_BYTES" envDefault:"16777216"`
	// WEBHOOK_POLL_INTERVAL: fallback poll when no NOTIFY arrives. Default 1s.
	PollInterval time.Duration `env:"WEBHOOK_POLL_INTERVAL" envDefault:"1s"`
	// WEBHOOK_SHUTDOWN_GRACE: on SIGTERM, how long requests in flight may
	// finish before they are cancelled and released without charging an
	// attempt. Keep it below the orchestrator's kill timeout. Default 5s.
	ShutdownGrace time.Duration `env:"WEBHOOK_SHUTDOWN_GRACE" envDefault:"5s"`
	// WEBHOOK_RETENTION: delivered deliveries (and their attempt log) older
	// than this are deleted; dead ones are kept for revive. Default 168h.
	Retention time.Duration `env:"WEBHOOK_RETENTION" envDefault:"168h"`
	// WEBHOOK_FAST_LANE: deliver straight from the event topics: each
	// `bridge deliver` joins CONSUMER_GROUP on CONSUMER_TOPICS and posts from
	// memory; only streams whose head failed (and rate-limited
	// subscriptions) go through bridge.deliveries. `bridge consume` is then
	// not run (`bridge run` leaves it out; `bridge consume` refuses to
	// start). Requires KAFKA_BROKERS and CONSUMER_TOPICS. false: the row
	// engine, `bridge consume` writing every delivery to bridge.deliveries
	// and `bridge deliver` posting those rows. Default true.
	FastLane bool `env:"WEBHOOK_FAST_LANE" envDefault:"true"`
	// WEBHOOK_FAST_LANE_MAX_WAITING: one subscription's deliveries of one
	// partition held in the fast lane's memory and not yet settled, at
	// most: past it (or past WEBHOOK_FAST_LANE_MAX_WAITING_BYTES or
	// WEBHOOK_FAST_LANE_MAX_WAITING_AGE), a subscription whose backlog is
	// its own (none of its streams waits for a worker) while another
	// subscription on the partition keeps up is handed to the slow lane as
	// a whole on that partition, so it never holds the partition's offset
	// or the member's memory for the others. Default 10000.
	FastLaneMaxWaiting int `env:"WEBHOOK_FAST_LANE_MAX_WAITING" envDefault:"10000"`
	// WEBHOOK_FAST_LANE_MAX_WAITING_BYTES: the record bytes of those
	// deliveries, at most. Default 16777216 (16 MiB).
	FastLaneMaxWaitingBytes int64 `env:"WEBHOOK_FAST_LANE_MAX_WAITING_BYTES" envDefault:"16777216"`
	// WEBHOOK_FAST_LANE_MAX_WAITING_AGE: how long the oldest of them may
	// have waited since it was read from the partition. Default 30s.
	FastLaneMaxWaitingAge time.Duration `env:"WEBHOOK_FAST_LANE_MAX_WAITING_AGE" envDefault:"30s"`
	// WEBHOOK_FAST_LANE_IN_FLIGHT_LIMIT: how many of its WEBHOOK_WORKERS
	// requests a fast-lane member sends at once. "adaptive": a live limit,
	// at most WEBHOOK_WORKERS, lowered while the member's requests take
	// longer than they do unloaded (each compared with its own
	// subscription's) and raised while they do not, so members sharing a
	// machine do not queue each other's requests; "fixed": WEBHOOK_WORKERS
	// at once. Default adaptive.
	FastLaneInFlightLimit string `env:"WEBHOOK_FAST_LANE_IN_FLIGHT_LIMIT" envDefault:"adaptive"`
}

// ParsedAllowedCIDRs returns WEBHOOK_ALLOWED_CIDRS as prefixes.
func (c Webhook) ParsedAllowedCIDRs() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.AllowedCIDRs {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fieldError("WEBHOOK_ALLOWED_CIDRS", s, "is not a CIDR (e.g. 127.0.0.0/8)")
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func (c Webhook) validate() error {
	if len(c.RetrySchedule) == 0 {
		return fieldError("WEBHOOK_RETRY_SCHEDULE", "", "must list at least one duration")
	}
	for i, d := range c.RetrySchedule {
		if d < 0 {
			// The whole value, and which item: quoting only "-1s" reads as
			// if that were the variable's value.
			all := make([]string, len(c.RetrySchedule))
			for j, x := range c.RetrySchedule {
				all[j] = x.String()
			}
			return fieldError("WEBHOOK_RETRY_SCHEDULE", strings.Join(all, ","),
				fmt.Sprintf("item %d (%s) is negative; durations must not be negative", i+1, d))
		}
	}
	switch {
	case c.DisableAfter < 1:
		return fieldError("WEBHOOK_DISABLE_AFTER", fmt.Sprint(c.DisableAfter), "must be at least 1")
	case c.BreakerAfter < 0:
		return fieldError("WEBHOOK_BREAKER_AFTER", fmt.Sprint(c.BreakerAfter), "must be 0 (never) or more")
	case c.BreakerProbeInterval <= 0:
		return fieldError("WEBHOOK_BREAKER_PROBE_INTERVAL", c.BreakerProbeInterval.String(), "must be positive")
	case c.Timeout <= 0:
		return fieldError("WEBHOOK_TIMEOUT", c.Timeout.String(), "must be positive")
	case c.Lease <= c.Timeout:
		return fieldError("WEBHOOK_LEASE", c.Lease.String(), "must be longer than WEBHOOK_TIMEOUT")
	case c.SecretGrace < 0:
		return fieldError("WEBHOOK_SECRET_GRACE", c.SecretGrace.String(), "must not be negative")
	case c.MaxInFlightPerSubscription < 1:
		return fieldError("WEBHOOK_MAX_IN_FLIGHT_PER_SUBSCRIPTION", fmt.Sprint(c.MaxInFlightPerSubscription), "must be at least 1")
	case c.Workers < 1:
		return fieldError("WEBHOOK_WORKERS", fmt.Sprint(c.Workers), "must be at least 1")
	case c.ClaimLoops < 1 || c.ClaimLoops > 64:
		return fieldError("WEBHOOK_CLAIM_LOOPS", fmt.Sprint(c.ClaimLoops), "must be between 1 and 64")
	case c.ClaimBytes < 1:
		return fieldError("WEBHOOK_CLAIM_BYTES", fmt.Sprint(c.ClaimBytes), "must be at least 1")
	case c.PollInterval <= 0:
		return fieldError("WEBHOOK_POLL_INTERVAL", c.PollInterval.String(), "must be positive")
	case c.ShutdownGrace <= 0:
		return fieldError("WEBHOOK_SHUTDOWN_GRACE", c.ShutdownGrace.String(), "must be positive")
	case c.Retention <= 0:
		return fieldError("WEBHOOK_RETENTION", c.Retention.String(), "must be positive")
	case c.FastLaneMaxWaiting < 1:
		return fieldError("WEBHOOK_FAST_LANE_MAX_WAITING", fmt.Sprint(c.FastLaneMaxWaiting), "must be at least 1")
	case c.FastLaneMaxWaitingBytes < 1:
		return fieldError("WEBHOOK_FAST_LANE_MAX_WAITING_BYTES", fmt.Sprint(c.FastLaneMaxWaitingBytes), "must be at least 1")
	case c.FastLaneMaxWaitingAge <= 0:
		return fieldError("WEBHOOK_FAST_LANE_MAX_WAITING_AGE", c.FastLaneMaxWaitingAge.String(), "must be positive")
	case c.FastLaneInFlightLimit != "adaptive" && c.FastLaneInFlightLimit != "fixed":
		return fieldError("WEBHOOK_FAST_LANE_IN_FLIGHT_LIMIT", c.FastLaneInFlightLimit, "must be adaptive or fixed")
	}
	_, err := c.ParsedAllowedCIDRs()
	return err
}

// SchemaRegistry configures the Confluent-compatible schema registry that governs
// topics (docs/contract.md, "Schema-governed topics").
type SchemaRegistry struct {
	// SCHEMA_REGISTRY_URL: the registry's Confluent-compatible API (for
	// Apicurio Registry http://HOST:8081/apis/ccompat/v7). When set, the relay
	// validates and frames the events of every governed topic. Default none
	// (no topic is governed).
	URL string `env:"SCHEMA_REGISTRY_URL" secret:"url"`
	// SCHEMA_REGISTRY_REFRESH: how long a topic's latest schema is used
	// before the registry is asked again (a new version is in force within
	// this, without a restart). Default 5s.
	Refresh time.Duration `env:"SCHEMA_REGISTRY_REFRESH" envDefault:"5s"`
}

func (c SchemaRegistry) validate() error {
	if c.Refresh <= 0 {
		return fieldError("SCHEMA_REGISTRY_REFRESH", c.Refresh.String(), "must be positive")
	}
	if c.URL == "" {
		return nil
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fieldError("SCHEMA_REGISTRY_URL", RedactURL(c.URL), "must be an http:// or https:// URL of the registry's Confluent-compatible API")
	}
	return nil
}

// Operations configures the operational events (subscription disabled,
// enabled, failing, secret rotated; delivery dead; outbox row FAILED) that
// the relay, the deliverer and the subscription commands enqueue into
// bridge.outbox in the transaction of the change they report.
type Operations struct {
	// BRIDGE_OPERATIONS_TOPIC: the Kafka topic of the operational events;
	// set it empty to send none. Checked against Kafka's topic name rules at
	// start-up. Default bridge.operations.
	Topic string `env:"BRIDGE_OPERATIONS_TOPIC" envDefault:"bridge.operations"`
}

func (c Operations) validate() error {
	if c.Topic == "" {
		return nil
	}
	if p := topicname.Problem(c.Topic); p != "" {
		return fieldError("BRIDGE_OPERATIONS_TOPIC", c.Topic, "is not a valid Kafka topic name: "+p)
	}
	return nil
}

// Secrets configures how webhook signing secrets are stored: sealed with
// AES-256-GCM under a key ring (see docs/webhooks.md, "Signing secrets at
// rest").
type Secrets struct {
	// BRIDGE_SECRET_KEYS: the key ring that encrypts signing secrets at rest:
	// comma-separated <id>:<base64 of 32 random bytes> (make a key with
	// `openssl rand -base64 32`; an id is up to 32 letters, digits, '-', '_'
	// or '.'). The first key encrypts, every key decrypts: to rotate, put a
	// new key first, run `bridge secrets rotate-key`, then drop the old one.
	// Required by deliver, run, subscription create/rotate-secret and every
	// process serving the admin API, unless BRIDGE_ALLOW_PLAINTEXT_SECRETS.
	Keys []string `env:"BRIDGE_SECRET_KEYS" envSeparator:"," secret:"keyring"`
	// BRIDGE_ALLOW_PLAINTEXT_SECRETS: true lets those commands run without
	// BRIDGE_SECRET_KEYS, storing new signing secrets in plain text (anyone
	// who can read the database or a backup can then forge webhooks); each
	// start logs a warning. Not for production. Default false.
	AllowPlaintext bool `env:"BRIDGE_ALLOW_PLAINTEXT_SECRETS" envDefault:"false"`

	// ring is Keys parsed (Load); nil without keys.
	ring *keyring.Ring
}

// Ring is the parsed BRIDGE_SECRET_KEYS; nil when it is not set.
func (c Secrets) Ring() *keyring.Ring { return c.ring }

func (c *Secrets) parse() error {
	ring, err := keyring.Parse(c.Keys)
	if err != nil {
		// The item's position and id, never its key material.
		return fieldError(keyring.Var, "", err.Error()+". Format: "+keyring.Format)
	}
	c.ring = ring
	return nil
}

// Require refuses a command that writes or uses signing secrets without a
// key ring, unless plain text is allowed; what names the command.
func (c Secrets) Require(what string) error {
	if c.ring != nil || c.AllowPlaintext {
		return nil
	}
	return fieldError(keyring.Var, "", "is required by "+what+": it encrypts the webhook signing secrets at rest. Format: "+
		keyring.Format+". BRIDGE_ALLOW_PLAINTEXT_SECRETS=true stores them in plain text instead (not for production)")
}

// Config is the whole configuration. Each command validates the parts it
// uses (a relay does not need webhook settings to be sensible).
type Config struct {
	Log      Log
	Database Database
	Kafka    Kafka
	HTTP     HTTP
	Relay    Relay
	Consumer Consumer
	Webhook  Webhook
	// Operations: BRIDGE_OPERATIONS_TOPIC.
	Operations Operations
	Secrets    Secrets
	Schemas    SchemaRegistry
}

// Error is a configuration error naming the variable at fault.
type Error struct {
	Var     string
	Value   string
	Problem string
}

func (e *Error) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s %s", e.Var, e.Problem)
	}
	return fmt.Sprintf("%s=%q %s", e.Var, e.Value, e.Problem)
}

// problemUnset is the Problem of a required variable that is not set.
const problemUnset = "is required but not set"

// Unset reports whether the error is a required variable left unset (as
// opposed to one set to something wrong).
func (e *Error) Unset() bool { return e.Problem == problemUnset }

// oneOf is the error for variable name when match (its value, or the
// value's lower case for a case-insensitive one) is none of allowed; nil when
// it is one. The error shows value as it was given.
func oneOf(name, value, match, problem string, allowed ...string) error {
	if slices.Contains(allowed, match) {
		return nil
	}
	return fieldError(name, value, problem)
}

func fieldError(name, value, problem string) error {
	return &Error{Var: name, Value: value, Problem: problem}
}

// Needs says which optional parts a command requires.
type Needs struct {
	Database bool
	Kafka    bool
	Topics   bool
	// Secrets: the command writes or uses signing secrets, so it needs
	// BRIDGE_SECRET_KEYS (or BRIDGE_ALLOW_PLAINTEXT_SECRETS=true).
	Secrets bool
	// FanOut: the command is the row engine's fan-out (`bridge consume`),
	// which WEBHOOK_FAST_LANE replaces: refused while it is on, so two
	// readers in one group do not split the partitions between the paths.
	FanOut bool
	// Delivers: the command runs the deliverer; with WEBHOOK_FAST_LANE it
	// reads the event topics itself, so it needs KAFKA_BROKERS and
	// CONSUMER_TOPICS.
	Delivers bool
}

// CommandNeeds is what each command that runs the pipeline asks of Load:
// the command line's stages are built on it (`bridge run` is the union of
// relay, consume and deliver), and the deployment checks (configcheck for
// the Helm chart, the compose file's test) check manifests against it.
var CommandNeeds = map[string]Needs{
	"migrate": {Database: true},
	"relay":   {Database: true, Kafka: true},
	"consume": {Database: true, Kafka: true, Topics: true, FanOut: true},
	"deliver": {Database: true, Secrets: true, Delivers: true},
	"run":     {Database: true, Kafka: true, Topics: true, Secrets: true, Delivers: true},
}

// checkDeliveryPath is the rule between WEBHOOK_FAST_LANE and the commands:
// each error says what an installation configured for the other path
// (an upgrade from the row engine, the fast lane being the default) must
// change, and how to keep the row engine.
func (c *Config) checkDeliveryPath(needs Needs) error {
	if !c.Webhook.FastLane {
		return nil
	}
	if needs.FanOut {
		return &Error{Var: "WEBHOOK_FAST_LANE", Value: "true",
			Problem: "(the default) makes `bridge deliver` read CONSUMER_TOPICS itself; stop `bridge consume` (its pending deliveries are served by `bridge deliver`), or set WEBHOOK_FAST_LANE=false to keep the row engine"}
	}
	if !needs.Delivers {
		return nil
	}
	return c.RequireEventTopics("by `bridge deliver` with WEBHOOK_FAST_LANE (the default), which reads the event topics itself; set it as for `bridge consume`")
}

// RequireEventTopics checks KAFKA_BROKERS and CONSUMER_TOPICS for what
// reads the event topics because of the fast lane; why says who needs them
// and why, and each error adds the way back to the row engine.
func (c *Config) RequireEventTopics(why string) error {
	for _, v := range []struct {
		name    string
		missing bool
	}{{"KAFKA_BROKERS", len(c.Kafka.Brokers) == 0}, {"CONSUMER_TOPICS", len(c.Consumer.Topics) == 0}} {
		if v.missing {
			return &Error{Var: v.name, Problem: "is required " + why + ", or set WEBHOOK_FAST_LANE=false to keep the row engine"}
		}
	}
	if err := c.Kafka.Validate(true); err != nil {
		return err
	}
	return c.Consumer.Validate(true)
}

// Load reads every component from the environment (environ: nil means the
// process environment) and validates what the command needs.
func Load(environ map[string]string, needs Needs) (*Config, error) {
	var cfg Config
	environ, err := normalizeLists(environ)
	if err != nil {
		return nil, err
	}
	opts := env.Options{Environment: environ}
	// Database is parsed on its own so a command that does not need it does
	// not fail on the required DATABASE_URL.
	parts := []any{&cfg.Log, &cfg.Kafka, &cfg.HTTP, &cfg.Relay, &cfg.Consumer, &cfg.Webhook, &cfg.Secrets, &cfg.Operations, &cfg.Schemas}
	if needs.Database {
		parts = append(parts, &cfg.Database)
	} else {
		dbOpts := opts
		if err := env.ParseWithOptions(&cfg.Database, dbOpts); err != nil && !isOnlyUnset(err) {
			return nil, describe(withoutUnset(err), &cfg.Database)
		}
	}
	for _, p := range parts {
		if err := env.ParseWithOptions(p, opts); err != nil {
			return nil, describe(err, p)
		}
	}
	// The env library gives an empty variable its default; an empty
	// BRIDGE_OPERATIONS_TOPIC means "none".
	if v, ok := environ["BRIDGE_OPERATIONS_TOPIC"]; ok && strings.TrimSpace(v) == "" {
		cfg.Operations.Topic = ""
	}
	checks := []error{cfg.Log.validate(), cfg.HTTP.validate(), cfg.Relay.validate(), cfg.Webhook.validate(), cfg.checkDeliveryPath(needs), cfg.Kafka.Validate(needs.Kafka), cfg.Consumer.Validate(needs.Topics), cfg.Secrets.parse(), cfg.Operations.validate(), cfg.Schemas.validate()}
	if needs.Database {
		checks = append(checks, cfg.Database.validate())
	}
	for _, err := range checks {
		if err != nil {
			return nil, err
		}
	}
	if needs.Secrets {
		if err := cfg.Secrets.Require("this command (it writes or signs with webhook signing secrets)"); err != nil {
			return nil, err
		}
	}
	if cfg.HTTP.Addr == HTTPOff {
		cfg.HTTP.Addr = ""
	}
	for i, b := range cfg.Kafka.Brokers {
		cfg.Kafka.Brokers[i] = strings.TrimSpace(b)
	}
	return &cfg, nil
}

// normalizeLists returns environ (nil: the process environment) with every
// list variable (a field with an envSeparator) trimmed around its commas.
// Every list is read alike: 'a, b' is a and b whether the items are CIDRs,
// durations or topics (one parser refusing ' 2s' while another trims it
// would make the same text mean two things), and an empty item ('a,,b', a trailing comma) is
// refused naming the variable instead of being kept or dropped silently.
func normalizeLists(environ map[string]string) (map[string]string, error) {
	if environ == nil {
		environ = map[string]string{}
		for _, kv := range os.Environ() {
			if k, v, ok := strings.Cut(kv, "="); ok {
				environ[k] = v
			}
		}
	} else {
		environ = maps.Clone(environ)
	}
	for _, name := range listVars() {
		raw, ok := environ[name]
		shown := raw
		if secretVars()[name] {
			shown = "" // a key ring's material must not reach an error
		}
		if !ok || strings.TrimSpace(raw) == "" {
			continue
		}
		items := strings.Split(raw, ",")
		for i, it := range items {
			items[i] = strings.TrimSpace(it)
			if items[i] == "" {
				return nil, fieldError(name, shown, fmt.Sprintf("has an empty item (item %d of %d): separate items with single commas", i+1, len(items)))
			}
		}
		environ[name] = strings.Join(items, ",")
	}
	return environ, nil
}

// listVars are the variables read as comma-separated lists.
func listVars() []string {
	var out []string
	for name, f := range envFields() {
		if f.Tag.Get("envSeparator") != "" {
			out = append(out, name)
		}
	}
	return out
}

// secretVars are the variables whose values are secret (a secret tag):
// errors name them without their value.
func secretVars() map[string]bool {
	out := map[string]bool{}
	for name, f := range envFields() {
		if f.Tag.Get("secret") != "" {
			out[name] = true
		}
	}
	return out
}

// envFields yields each field of the config structs that is read from the
// environment, with its variable's name: the one walk over the env tags that
// Vars, listVars and secretVars filter.
func envFields() iter.Seq2[string, reflect.StructField] {
	return func(yield func(string, reflect.StructField) bool) {
		t := reflect.TypeFor[Config]()
		for i := 0; i < t.NumField(); i++ {
			st := t.Field(i).Type
			for j := 0; j < st.NumField(); j++ {
				f := st.Field(j)
				if name, _, _ := strings.Cut(f.Tag.Get("env"), ","); name != "" && !yield(name, f) {
					return
				}
			}
		}
	}
}

func isOnlyUnset(err error) bool {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return false
	}
	for _, e := range agg.Errors {
		var unset env.VarIsNotSetError
		if !errors.As(e, &unset) {
			return false
		}
	}
	return true
}

// withoutUnset drops "required but not set" errors from an aggregate, so a
// command that does not need the database reports the malformed variable
// (DATABASE_CONNECT_TIMEOUT=later) rather than the unset DATABASE_URL.
func withoutUnset(err error) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return err
	}
	var kept []error
	for _, e := range agg.Errors {
		var unset env.VarIsNotSetError
		if !errors.As(e, &unset) {
			kept = append(kept, e)
		}
	}
	return env.AggregateError{Errors: kept}
}

// describe turns caarlos0/env's aggregate error into one line naming the
// first variable at fault; part is the struct being parsed, whose field the
// parse error names (several components share field names like PollInterval).
func describe(err error, part any) error {
	var agg env.AggregateError
	if errors.As(err, &agg) && len(agg.Errors) > 0 {
		err = agg.Errors[0]
	}
	var unset env.VarIsNotSetError
	if errors.As(err, &unset) {
		return fieldError(unset.Key, "", problemUnset)
	}
	var empty env.EmptyVarError
	if errors.As(err, &empty) {
		return fieldError(empty.Key, "", "must not be empty")
	}
	var perr env.ParseError
	if errors.As(err, &perr) {
		return fieldError(envNameOf(reflect.TypeOf(part).Elem(), perr.Name), "", fmt.Sprintf("is not a valid %s: %v", perr.Type, unwrapAll(perr.Err)))
	}
	return fmt.Errorf("configuration: %w", err)
}

func unwrapAll(err error) error {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err
		}
		err = u
	}
}

// envNameOf maps a field name of component t reported by a parse error to its
// environment variable.
func envNameOf(t reflect.Type, field string) string {
	if f, ok := t.FieldByName(field); ok {
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		return name
	}
	return field
}
