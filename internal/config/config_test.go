package config_test

import (
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxbridge/bridge/internal/config"
)

const validDatabaseURL = "postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable"

// env returns a minimal valid environment plus overrides.
func env(overrides map[string]string) map[string]string {
	e := map[string]string{"DATABASE_URL": validDatabaseURL}
	maps.Copy(e, overrides)
	return e
}

// requireConfigError asserts err is a one-line *config.Error naming variable.
func requireConfigError(t *testing.T, err error, variable string) *config.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("Load succeeded, want an error naming %s", variable)
	}
	var ce *config.Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %q (%T) is not a *config.Error", err, err)
	}
	if ce.Var != variable {
		t.Errorf("error names %s, want %s (message %q)", ce.Var, variable, err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, variable) {
		t.Errorf("message %q does not start with %s", msg, variable)
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("message %q is more than one line", msg)
	}
	return ce
}

func TestLoadMissingDatabaseURLNamesIt(t *testing.T) {
	t.Parallel()
	for name, environ := range map[string]map[string]string{
		"unset": {},
		"empty": {"DATABASE_URL": ""},
		"blank": {"DATABASE_URL": "   "},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Load(environ, config.Needs{Database: true})
			requireConfigError(t, err, "DATABASE_URL")
		})
	}
}

func TestLoadWithoutDatabaseNeedsNoURL(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(map[string]string{}, config.Needs{})
	if err != nil {
		t.Fatalf("Load without Needs.Database: %v", err)
	}
	if cfg.Database.URL != "" {
		t.Errorf("Database.URL = %q, want empty", cfg.Database.URL)
	}
	// A malformed database variable still fails even when not needed.
	_, err = config.Load(map[string]string{"DATABASE_CONNECT_TIMEOUT": "later"}, config.Needs{})
	requireConfigError(t, err, "DATABASE_CONNECT_TIMEOUT")
}

func TestLoadMalformedValueNamesVariable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		variable, value string
		needs           config.Needs
		// wantInMessage is a fragment saying what is wrong.
		wantInMessage string
	}{
		{"RELAY_MAX_ATTEMPTS", "abc", config.Needs{}, "int"},
		{"RELAY_MAX_ATTEMPTS", "0", config.Needs{}, "at least 1"},
		{"RELAY_POLL_INTERVAL", "soon", config.Needs{}, "Duration"},
		{"RELAY_BATCH_SIZE", "-1", config.Needs{}, "between"},
		{"RELAY_BATCH_BYTES", "0", config.Needs{}, "at least 1"},
		{"RELAY_PRODUCE_TIMEOUT", "10ms", config.Needs{}, "at least 1s"},
		// Webhook and Relay both have a PollInterval field: the error must
		// name the variable that was actually wrong.
		{"WEBHOOK_POLL_INTERVAL", "soon", config.Needs{}, "Duration"},
		{"WEBHOOK_TIMEOUT", "forever", config.Needs{}, "Duration"},
		{"WEBHOOK_LEASE", "1s", config.Needs{}, "longer than WEBHOOK_TIMEOUT"},
		{"WEBHOOK_RETRY_SCHEDULE", "5s,banana", config.Needs{}, "banana"},
		{"WEBHOOK_RETRY_SCHEDULE", "5s,-1s", config.Needs{}, "negative"},
		{"WEBHOOK_RETRY_SCHEDULE", "1h,-1s", config.Needs{}, `WEBHOOK_RETRY_SCHEDULE="1h0m0s,-1s" item 2 (-1s) is negative`},
		{"WEBHOOK_ALLOWED_CIDRS", "notacidr", config.Needs{}, "not a CIDR"},
		{"WEBHOOK_CLAIM_LOOPS", "0", config.Needs{}, "between 1 and 64"},
		{"WEBHOOK_BREAKER_AFTER", "-1", config.Needs{}, "0 (never) or more"},
		{"WEBHOOK_BREAKER_PROBE_INTERVAL", "0s", config.Needs{}, "must be positive"},
		{"WEBHOOK_CLAIM_BYTES", "0", config.Needs{}, "at least 1"},
		{"WEBHOOK_ALLOWED_CIDRS", "10.0.0.0/8,300.1.1.1/8", config.Needs{}, "not a CIDR"},
		{"WEBHOOK_ALLOW_HTTP", "maybe", config.Needs{}, "bool"},
		{"LOG_FORMAT", "xml", config.Needs{}, "text or json"},
		{"LOG_LEVEL", "loud", config.Needs{}, "debug, info, warn, error"},
		{"HTTP_ADDR", "8080", config.Needs{}, "host:port"},
		{"JAEGER_QUERY_URL", "127.0.0.1:16686", config.Needs{}, "http:// or https:// URL"},
		{"JAEGER_UI_URL", "ftp://jaeger", config.Needs{}, "http:// or https:// URL"},
		{"KAFKA_BROKERS", "nohostport", config.Needs{}, "host:port"},
		{"KAFKA_BROKERS", "127.0.0.1:9092,nohostport", config.Needs{Kafka: true}, "nohostport"},
		{"KAFKA_BROKERS", "", config.Needs{Kafka: true}, "required"},
		{"KAFKA_SASL_MECHANISM", "GSSAPI", config.Needs{}, "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"},
		{"KAFKA_TLS", "yes please", config.Needs{}, "bool"},
		{"CONSUMER_TOPICS", "", config.Needs{Topics: true}, "required"},
		{"CONSUMER_MAX_POLL_RECORDS", "many", config.Needs{}, "int"},
		{"DATABASE_URL", "mysql://root@db/app", config.Needs{Database: true}, "postgres://"},
		{"DATABASE_CONNECT_TIMEOUT", "-1s", config.Needs{Database: true}, "must not be negative"},
		{"CONSUMER_SESSION_TIMEOUT", "500ms", config.Needs{}, "at least 1s"},
		{"CONSUMER_REBALANCE_TIMEOUT", "soon", config.Needs{}, "duration"},
		{"CONSUMER_GROUP_PROTOCOL", "eager", config.Needs{}, "classic or consumer"},
		{"DATABASE_MAX_CONNS", "lots", config.Needs{Database: true}, "int"},
		{"DATABASE_URL", "not a url", config.Needs{Database: true}, "cannot be parsed"},
		{"HTTP_ADDR", ":99999", config.Needs{}, "out of range"},
		{"HTTP_ADDR", "127.0.0.1:http", config.Needs{}, "not a number"},
		{"KAFKA_BROKERS", "k1:70000", config.Needs{}, "out of range"},
		{"KAFKA_BROKERS", "k1:0", config.Needs{}, "port 0"},
		{"CONSUMER_TOPICS", "a,,b", config.Needs{}, "empty item (item 2 of 3)"},
		{"CONSUMER_TOPICS", "a,b,", config.Needs{Topics: true}, "empty item"},
		{"KAFKA_BROKERS", "k1:9092, ,k2:9092", config.Needs{}, "empty item"},
		{"WEBHOOK_RETRY_SCHEDULE", "1s,,2s", config.Needs{}, "empty item"},
		{"WEBHOOK_ALLOWED_CIDRS", ",127.0.0.0/8", config.Needs{}, "empty item"},
		{"BRIDGE_OPERATIONS_TOPIC", "ops events", config.Needs{}, "not a valid Kafka topic name"},
		{"BRIDGE_OPERATIONS_TOPIC", "..", config.Needs{}, "not a valid Kafka topic name"},
		{"BRIDGE_OPERATIONS_TOPIC", "__ops", config.Needs{}, "reserved"},
		{"BRIDGE_OPERATIONS_TOPIC", strings.Repeat("o", 250), config.Needs{}, "at most 249"},
		{"RELAY_CLOUDEVENTS", "structured", config.Needs{}, "off or binary"},
	}
	for _, tt := range tests {
		t.Run(tt.variable+"="+tt.value, func(t *testing.T) {
			t.Parallel()
			_, err := config.Load(env(map[string]string{tt.variable: tt.value}), tt.needs)
			requireConfigError(t, err, tt.variable)
			if !strings.Contains(err.Error(), tt.wantInMessage) {
				t.Errorf("message %q does not say %q", err, tt.wantInMessage)
			}
		})
	}
}

// An empty BRIDGE_OPERATIONS_TOPIC turns the operational events off (the
// env library would otherwise give it its default); unset, it is the
// default.
func TestLoadEmptyOperationsTopicDisables(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(env(map[string]string{"BRIDGE_OPERATIONS_TOPIC": ""}), config.Needs{})
	if err != nil || cfg.Operations.Topic != "" {
		t.Fatalf("empty: topic %q, err %v", cfg.Operations.Topic, err)
	}
	cfg, err = config.Load(env(map[string]string{}), config.Needs{})
	if err != nil || cfg.Operations.Topic != "bridge.operations" {
		t.Fatalf("unset: topic %q, err %v", cfg.Operations.Topic, err)
	}
}

// Every list variable trims the spaces around its commas, whatever its
// items are; HTTP_ADDR port 0 (any free port) stays allowed.
func TestLoadListsTrimmedAlike(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(env(map[string]string{
		"WEBHOOK_ALLOWED_CIDRS":  "127.0.0.0/8, ::1/128",
		"WEBHOOK_RETRY_SCHEDULE": "1s, 2s",
		"KAFKA_BROKERS":          "k1:9092 , k2:9092",
		"CONSUMER_TOPICS":        " a , b",
		"HTTP_ADDR":              "127.0.0.1:0",
	}), config.Needs{Database: true, Kafka: true, Topics: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Webhook.RetrySchedule; len(got) != 2 || got[0] != time.Second || got[1] != 2*time.Second {
		t.Errorf("WEBHOOK_RETRY_SCHEDULE = %v", got)
	}
	if got := strings.Join(cfg.Webhook.AllowedCIDRs, "|"); got != "127.0.0.0/8|::1/128" {
		t.Errorf("WEBHOOK_ALLOWED_CIDRS = %q", got)
	}
	if got := strings.Join(cfg.Kafka.Brokers, "|"); got != "k1:9092|k2:9092" {
		t.Errorf("KAFKA_BROKERS = %q", got)
	}
	if got := strings.Join(cfg.Consumer.Topics, "|"); got != "a|b" {
		t.Errorf("CONSUMER_TOPICS = %q", got)
	}
}

func TestLoadSASLNeedsCredentials(t *testing.T) {
	t.Parallel()
	_, err := config.Load(env(map[string]string{"KAFKA_SASL_MECHANISM": "PLAIN"}), config.Needs{})
	requireConfigError(t, err, "KAFKA_SASL_USERNAME")
	_, err = config.Load(env(map[string]string{"KAFKA_TLS_CERT_FILE": "/tmp/cert.pem"}), config.Needs{})
	requireConfigError(t, err, "KAFKA_TLS_CERT_FILE")
}

func TestLoadDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(env(nil), config.Needs{Database: true})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	got := map[string]any{
		"LOG_LEVEL":                              cfg.Log.Level,
		"LOG_FORMAT":                             cfg.Log.Format,
		"DATABASE_CONNECT_TIMEOUT":               cfg.Database.ConnectTimeout,
		"DATABASE_MAX_CONNS":                     cfg.Database.MaxConns,
		"KAFKA_BROKERS":                          len(cfg.Kafka.Brokers),
		"KAFKA_CLIENT_ID":                        cfg.Kafka.ClientID,
		"KAFKA_TLS":                              cfg.Kafka.TLS,
		"KAFKA_SASL_MECHANISM":                   cfg.Kafka.SASLMechanism,
		"HTTP_ADDR":                              cfg.HTTP.Addr,
		"ADMIN_TOKEN":                            cfg.HTTP.AdminToken,
		"RELAY_MAX_ATTEMPTS":                     cfg.Relay.MaxAttempts,
		"RELAY_BACKOFF_BASE":                     cfg.Relay.BackoffBase,
		"RELAY_BACKOFF_MAX":                      cfg.Relay.BackoffMax,
		"RELAY_BATCH_SIZE":                       cfg.Relay.BatchSize,
		"RELAY_BATCH_BYTES":                      cfg.Relay.BatchBytes,
		"RELAY_POLL_INTERVAL":                    cfg.Relay.PollInterval,
		"RELAY_LEASE_TIMEOUT":                    cfg.Relay.LeaseTimeout,
		"RELAY_PRODUCE_TIMEOUT":                  cfg.Relay.ProduceTimeout,
		"RELAY_RETENTION":                        cfg.Relay.Retention,
		"RELAY_MAX_MESSAGE_BYTES":                cfg.Relay.MaxMessageBytes,
		"RELAY_CLOUDEVENTS":                      cfg.Relay.CloudEvents,
		"RELAY_CLOUDEVENTS_SOURCE":               cfg.Relay.CloudEventsSource,
		"CONSUMER_GROUP":                         cfg.Consumer.Group,
		"CONSUMER_DEDUP_WINDOW":                  cfg.Consumer.DedupWindow,
		"CONSUMER_MAX_POLL_RECORDS":              cfg.Consumer.MaxPollRecords,
		"CONSUMER_SESSION_TIMEOUT":               cfg.Consumer.SessionTimeout,
		"CONSUMER_REBALANCE_TIMEOUT":             cfg.Consumer.RebalanceTimeout,
		"CONSUMER_INSTANCE_ID":                   cfg.Consumer.InstanceID,
		"CONSUMER_GROUP_PROTOCOL":                cfg.Consumer.GroupProtocol,
		"WEBHOOK_RETRY_SCHEDULE":                 cfg.Webhook.RetrySchedule,
		"WEBHOOK_DISABLE_AFTER":                  cfg.Webhook.DisableAfter,
		"WEBHOOK_BREAKER_AFTER":                  cfg.Webhook.BreakerAfter,
		"WEBHOOK_BREAKER_PROBE_INTERVAL":         cfg.Webhook.BreakerProbeInterval,
		"WEBHOOK_TIMEOUT":                        cfg.Webhook.Timeout,
		"WEBHOOK_LEASE":                          cfg.Webhook.Lease,
		"WEBHOOK_ALLOW_HTTP":                     cfg.Webhook.AllowHTTP,
		"WEBHOOK_SECRET_GRACE":                   cfg.Webhook.SecretGrace,
		"WEBHOOK_MAX_IN_FLIGHT_PER_SUBSCRIPTION": cfg.Webhook.MaxInFlightPerSubscription,
		"WEBHOOK_WORKERS":                        cfg.Webhook.Workers,
		"WEBHOOK_CLAIM_LOOPS":                    cfg.Webhook.ClaimLoops,
		"WEBHOOK_CLAIM_BYTES":                    cfg.Webhook.ClaimBytes,
		"WEBHOOK_POLL_INTERVAL":                  cfg.Webhook.PollInterval,
	}
	want := map[string]any{
		"LOG_LEVEL":                              "info",
		"LOG_FORMAT":                             "text",
		"DATABASE_CONNECT_TIMEOUT":               3 * time.Minute,
		"DATABASE_MAX_CONNS":                     int32(10),
		"KAFKA_BROKERS":                          0,
		"KAFKA_CLIENT_ID":                        "outbox-bridge",
		"KAFKA_TLS":                              false,
		"KAFKA_SASL_MECHANISM":                   "",
		"HTTP_ADDR":                              "127.0.0.1:8080",
		"ADMIN_TOKEN":                            "",
		"RELAY_MAX_ATTEMPTS":                     10,
		"RELAY_BACKOFF_BASE":                     7 * time.Second,
		"RELAY_BACKOFF_MAX":                      30 * time.Minute,
		"RELAY_BATCH_SIZE":                       1000,
		"RELAY_BATCH_BYTES":                      16777216,
		"RELAY_POLL_INTERVAL":                    time.Second,
		"RELAY_LEASE_TIMEOUT":                    15 * time.Second,
		"RELAY_PRODUCE_TIMEOUT":                  30 * time.Second,
		"RELAY_RETENTION":                        24 * time.Hour,
		"RELAY_MAX_MESSAGE_BYTES":                1000000,
		"RELAY_CLOUDEVENTS":                      "off",
		"RELAY_CLOUDEVENTS_SOURCE":               "outbox-bridge",
		"CONSUMER_GROUP":                         "outbox-bridge",
		"CONSUMER_DEDUP_WINDOW":                  168 * time.Hour,
		"CONSUMER_MAX_POLL_RECORDS":              500,
		"CONSUMER_SESSION_TIMEOUT":               6 * time.Second,
		"CONSUMER_REBALANCE_TIMEOUT":             30 * time.Second,
		"CONSUMER_INSTANCE_ID":                   "",
		"CONSUMER_GROUP_PROTOCOL":                "classic",
		"WEBHOOK_RETRY_SCHEDULE":                 []time.Duration{0, 5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour},
		"WEBHOOK_DISABLE_AFTER":                  5,
		"WEBHOOK_BREAKER_AFTER":                  10,
		"WEBHOOK_BREAKER_PROBE_INTERVAL":         time.Second,
		"WEBHOOK_TIMEOUT":                        15 * time.Second,
		"WEBHOOK_LEASE":                          60 * time.Second,
		"WEBHOOK_ALLOW_HTTP":                     false,
		"WEBHOOK_SECRET_GRACE":                   24 * time.Hour,
		"WEBHOOK_MAX_IN_FLIGHT_PER_SUBSCRIPTION": 64,
		"WEBHOOK_WORKERS":                        128,
		"WEBHOOK_CLAIM_LOOPS":                    4,
		"WEBHOOK_CLAIM_BYTES":                    16777216,
		"WEBHOOK_POLL_INTERVAL":                  time.Second,
	}
	for name, w := range want {
		g := got[name]
		if gs, ok := g.([]time.Duration); ok {
			if !equalDurations(gs, w.([]time.Duration)) {
				t.Errorf("%s default = %v, want %v", name, gs, w)
			}
			continue
		}
		if g != w {
			t.Errorf("%s default = %v (%T), want %v (%T)", name, g, g, w, w)
		}
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestDocumentedDefaultsMatchLoad reads config.go's doc comments ("VAR: ...
// Default X.") and checks every variable the config reads is documented, and
// that the documented default is what Load returns when the variable is unset.
func TestDocumentedDefaultsMatchLoad(t *testing.T) {
	t.Parallel()
	docs := documentedVars(t)
	cfg, err := config.Load(env(nil), config.Needs{Database: true})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	effective := map[string]string{}
	for _, s := range cfg.Settings() {
		effective[s.Var] = s.Value
	}
	defaultRE := regexp.MustCompile(`\bDefault ([^\s(]+)`)
	for _, v := range config.Vars() {
		doc, ok := docs[v]
		if !ok {
			t.Errorf("%s is read by the config but not documented in a field comment (\"%s: ...\")", v, v)
			continue
		}
		value, ok := effective[v]
		if !ok {
			t.Errorf("%s missing from Settings()", v)
			continue
		}
		if v == "DATABASE_URL" {
			continue // required; set by this test
		}
		m := defaultRE.FindStringSubmatch(doc)
		if m == nil {
			// No documented default: the zero value.
			if value != "" && value != "false" && value != "0" {
				t.Errorf("%s: no default documented (%q) but Load gives %q", v, doc, value)
			}
			continue
		}
		documented := strings.TrimRight(m[1], ".,")
		if documented == "none" {
			documented = ""
		}
		if !config.SameSetting(documented, value) {
			t.Errorf("%s: documented default %q, Load gives %q (doc: %q)", v, documented, value, doc)
		}
	}
}

// documentedVars maps each variable named at the start of a field comment in
// config.go ("VAR: ..." or "VAR_A / VAR_B: ...") to that comment.
func documentedVars(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "config.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatalf("parse config.go: %v", err)
	}
	out := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		field, ok := n.(*ast.Field)
		if !ok || field.Doc == nil {
			return true
		}
		text := strings.Join(strings.Fields(field.Doc.Text()), " ")
		head, _, ok := strings.Cut(text, ":")
		if !ok {
			return true
		}
		for name := range strings.SplitSeq(head, "/") {
			name = strings.TrimSpace(name)
			if name != "" && strings.ToUpper(name) == name && !strings.Contains(name, " ") {
				out[name] = text
			}
		}
		return true
	})
	if len(out) == 0 {
		t.Fatal("found no documented variables in config.go")
	}
	return out
}

func TestSettingsRedactSecrets(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		environ map[string]string
		secrets []string
		// keep are non-secret fragments that must still be shown.
		keep []string
	}{
		{
			name:    "URL password",
			environ: map[string]string{"DATABASE_URL": "postgres://bridge:Pa55w0rdXYZ@db.internal:5432/bridge?sslmode=require"},
			secrets: []string{"Pa55w0rdXYZ"},
			keep:    []string{"bridge:REDACTED@db.internal:5432/bridge", "sslmode=require"},
		},
		{
			name:    "URL password with escapes",
			environ: map[string]string{"DATABASE_URL": "postgresql://app:s%40cr%3Ait@db:5432/app"},
			secrets: []string{"s@cr:it", "s%40cr%3Ait", "s%40cr"},
			keep:    []string{"app:REDACTED@db:5432/app"},
		},
		{
			name:    "URL password query parameter",
			environ: map[string]string{"DATABASE_URL": "postgres://db:5432/app?user=app&password=QueryS3cret"},
			secrets: []string{"QueryS3cret"},
			keep:    []string{"user=app"},
		},
		{
			name:    "key=value password",
			environ: map[string]string{"DATABASE_URL": "host=db.internal port=5432 user=app password=KvS3cret dbname=app"},
			secrets: []string{"KvS3cret"},
			keep:    []string{"host=db.internal", "dbname=app"},
		},
		{
			name:    "key=value quoted password with spaces",
			environ: map[string]string{"DATABASE_URL": "host=db user=app password='two words here' dbname=app"},
			secrets: []string{"two words", "words here"},
			keep:    []string{"dbname=app"},
		},
		{
			name:    "key=value spaced password",
			environ: map[string]string{"DATABASE_URL": "host=db user=app password = Sp4cedOut dbname=app"},
			secrets: []string{"Sp4cedOut"},
		},
		{
			name: "tokens and SASL credentials",
			environ: map[string]string{
				"ADMIN_TOKEN":          "admin-token-7f3a9c",
				"KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
				"KAFKA_SASL_USERNAME":  "sasl-user-b8e2",
				"KAFKA_SASL_PASSWORD":  "sasl-pass-d41d",
			},
			secrets: []string{"admin-token-7f3a9c", "sasl-user-b8e2", "sasl-pass-d41d"},
			keep:    []string{"SCRAM-SHA-512"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := config.Load(env(tt.environ), config.Needs{Database: true})
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			out, err := json.Marshal(cfg.Settings())
			if err != nil {
				t.Fatal(err)
			}
			printed := string(out)
			for _, s := range tt.secrets {
				if strings.Contains(printed, s) {
					t.Errorf("Settings() shows secret %q: %s", s, printed)
				}
			}
			for _, k := range tt.keep {
				if !strings.Contains(printed, k) {
					t.Errorf("Settings() lost non-secret %q: %s", k, printed)
				}
			}
			if !strings.Contains(printed, "REDACTED") {
				t.Errorf("Settings() does not mark anything redacted: %s", printed)
			}
		})
	}
}

func TestSettingsListEveryVariableOnce(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(env(nil), config.Needs{Database: true})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	seen := map[string]int{}
	for _, s := range cfg.Settings() {
		seen[s.Var]++
	}
	for _, v := range config.Vars() {
		if seen[v] != 1 {
			t.Errorf("%s appears %d times in Settings(), want 1", v, seen[v])
		}
	}
	if len(seen) != len(config.Vars()) {
		t.Errorf("Settings() has %d variables, Vars() %d", len(seen), len(config.Vars()))
	}
	// Empty secrets stay empty rather than claiming a value was hidden.
	for _, s := range cfg.Settings() {
		if s.Var == "ADMIN_TOKEN" && s.Value != "" {
			t.Errorf("unset ADMIN_TOKEN shown as %q, want empty", s.Value)
		}
	}
}

// TestErrorsNeverEchoPasswords: a malformed DATABASE_URL is reported with its
// password redacted.
func TestErrorsNeverEchoPasswords(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"mysql://root:Hunter2Secret@db/app",
		"postgres://root:Hunter2Secret@db:notaport/app%zz",
	} {
		_, err := config.Load(env(map[string]string{"DATABASE_URL": u}), config.Needs{Database: true})
		requireConfigError(t, err, "DATABASE_URL")
		if strings.Contains(err.Error(), "Hunter2Secret") {
			t.Errorf("error %q shows the password", err)
		}
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"", ""},
		{"postgres://u:p@h:5432/d", "postgres://u:REDACTED@h:5432/d"},
		{"postgres://u@h/d", "postgres://u@h/d"},
		{"postgres://h/d?password=x&sslmode=disable", "postgres://h/d?password=REDACTED&sslmode=disable"},
		{"host=h password=x user=u", "host=h password=REDACTED user=u"},
		{"host=h PASSWORD='a b' user=u", "host=h PASSWORD=REDACTED user=u"},
		{"host=h user=u", "host=h user=u"},
	}
	for _, tt := range tests {
		if got := config.RedactURL(tt.in); got != tt.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// With RELAY_CLOUDEVENTS=binary the source must be a usable ce_source (an
// empty one takes the default); with CloudEvents off, it is not looked at.
func TestCloudEventsSourceChecked(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ source, want string }{
		{"my service", "spaces or control characters"},
		{"%zz", "URI reference"},
	} {
		_, err := config.Load(env(map[string]string{"RELAY_CLOUDEVENTS": "binary", "RELAY_CLOUDEVENTS_SOURCE": tt.source}), config.Needs{})
		requireConfigError(t, err, "RELAY_CLOUDEVENTS_SOURCE")
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("source %q: message %q does not say %q", tt.source, err, tt.want)
		}
	}
	for _, ok := range []map[string]string{
		{"RELAY_CLOUDEVENTS": "binary", "RELAY_CLOUDEVENTS_SOURCE": "https://shop.example.com/orders"},
		{"RELAY_CLOUDEVENTS": "binary"},
		{"RELAY_CLOUDEVENTS": "off", "RELAY_CLOUDEVENTS_SOURCE": ""},
	} {
		if _, err := config.Load(env(ok), config.Needs{}); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
}
