package composetest

import (
	"bufio"
	"context"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/outboxbridge/bridge/internal/adminapi"
	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/keyring"
	"github.com/outboxbridge/bridge/internal/tracing"
)

var root = filepath.Join("..", "..")

// bridgeCommands are the compose services that run the bridge image: the
// command each runs and what that command needs from the configuration
// (config.CommandNeeds, what the CLI passes to config.Load: with the fast
// lane on, deliver needs the brokers and topics and consume is refused).
var bridgeCommands = map[string]config.Needs{}

func init() {
	for _, c := range []string{"migrate", "relay", "consume", "deliver"} {
		bridgeCommands[c] = config.CommandNeeds[c]
	}
}

// required are the variables each bridge service must set itself (the
// rest have defaults). deliver and consume set WEBHOOK_FAST_LANE
// explicitly: which path runs is the file's choice, not the binary's
// default.
var required = map[string][]string{
	"migrate": {"DATABASE_URL"},
	"relay":   {"DATABASE_URL", "KAFKA_BROKERS"},
	"consume": {"DATABASE_URL", "KAFKA_BROKERS", "CONSUMER_TOPICS", "WEBHOOK_FAST_LANE"},
	"deliver": {"DATABASE_URL", "BRIDGE_SECRET_KEYS", "WEBHOOK_FAST_LANE"},
}

// fastLaneRequired are the further variables deliver must set on the fast
// lane.
var fastLaneRequired = []string{"KAFKA_BROKERS", "CONSUMER_TOPICS"}

// rowEngine is the documented switch back to the row engine:
// WEBHOOK_FAST_LANE=false docker compose --profile row-engine up.
var rowEngine = map[string]string{"WEBHOOK_FAST_LANE": "false"}

const rowEngineProfile = "row-engine"

// layouts are the two ways the file is meant to run: the default (the fast
// lane) and the row engine.
var layouts = []struct {
	name     string
	env      map[string]string
	profiles []string
}{
	{"fast lane", nil, nil},
	{"row engine", rowEngine, []string{rowEngineProfile}},
}

// load reads docker-compose.yml as `docker compose` would, interpolating
// from env only: the test's own environment (DATABASE_URL of the CI
// services, say) must not leak into what is checked. Services of other
// profiles than those given are left out, as `docker compose` leaves them.
func load(t *testing.T, env map[string]string, profiles ...string) *types.Project {
	t.Helper()
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	// A copy: the loader writes into it (COMPOSE_PROJECT_NAME), and the
	// layouts' maps are shared by the parallel tests.
	environment := types.Mapping{}
	maps.Copy(environment, env)
	details := types.ConfigDetails{
		WorkingDir:  abs,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(abs, "docker-compose.yml")}},
		Environment: environment,
	}
	p, err := loader.LoadWithContext(context.Background(), details, func(o *loader.Options) {
		o.SetProjectName("outbox-bridge", true)
		o.Profiles = profiles
	})
	if err != nil {
		t.Fatalf("docker-compose.yml does not load (schema or consistency): %v", err)
	}
	return p
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, err := p.GetService(name)
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return s
}

// environment is a service's variables; a variable listed without a value
// (taken from the host) maps to "" and is reported as unset.
func environment(s types.ServiceConfig) map[string]string {
	out := map[string]string{}
	for k, v := range s.Environment {
		if v != nil {
			out[k] = *v
		}
	}
	return out
}

func TestComposeServices(t *testing.T) {
	t.Parallel()
	p := load(t, nil)
	images := map[string]*regexp.Regexp{
		"postgres": regexp.MustCompile(`^postgres:16(\.|$|-)`),
		"kafka":    regexp.MustCompile(`^apache/kafka:4\.`),
		"jaeger":   regexp.MustCompile(`^jaegertracing/jaeger:2\.`),
	}
	for name, re := range images {
		if img := service(t, p, name).Image; !re.MatchString(img) {
			t.Errorf("%s: image %q, want %s", name, img, re)
		}
	}
	// Health checks on what others wait for.
	for _, name := range []string{"postgres", "kafka", "jaeger", "receiver"} {
		hc := service(t, p, name).HealthCheck
		if hc == nil || len(hc.Test) == 0 || hc.Disable {
			t.Errorf("%s has no health check", name)
		}
	}
	if hc := service(t, p, "postgres").HealthCheck; hc != nil && !slices.Contains(hc.Test, "pg_isready") {
		t.Errorf("postgres health check %v does not use pg_isready", hc.Test)
	}
	kafka := environment(service(t, p, "kafka"))
	if !strings.Contains(kafka["KAFKA_PROCESS_ROLES"], "controller") || !strings.Contains(kafka["KAFKA_PROCESS_ROLES"], "broker") {
		t.Errorf("kafka is not a combined KRaft node: KAFKA_PROCESS_ROLES=%q", kafka["KAFKA_PROCESS_ROLES"])
	}
	jaegerPorts := map[uint32]bool{}
	for _, port := range service(t, p, "jaeger").Ports {
		jaegerPorts[port.Target] = true
	}
	for _, port := range []uint32{16686, 4317, 4318} {
		if !jaegerPorts[port] {
			t.Errorf("jaeger does not publish %d", port)
		}
	}

	// Start order.
	row := load(t, rowEngine, rowEngineProfile)
	deps := func(name string) map[string]string {
		out := map[string]string{}
		for dep, d := range service(t, row, name).DependsOn {
			out[dep] = d.Condition
		}
		return out
	}
	if got := deps("migrate")["postgres"]; got != types.ServiceConditionHealthy {
		t.Errorf("migrate depends on postgres with %q, want %s", got, types.ServiceConditionHealthy)
	}
	if r := service(t, p, "migrate").Restart; r != "no" && r != "" {
		t.Errorf("migrate restarts %q: a one-shot must not", r)
	}
	for _, name := range []string{"relay", "consume", "deliver"} {
		d := deps(name)
		if d["migrate"] != types.ServiceConditionCompletedSuccessfully {
			t.Errorf("%s depends on migrate with %q, want %s", name, d["migrate"], types.ServiceConditionCompletedSuccessfully)
		}
		if d["kafka"] != types.ServiceConditionHealthy {
			t.Errorf("%s depends on kafka with %q, want %s", name, d["kafka"], types.ServiceConditionHealthy)
		}
	}

	// Exactly the bridge services run the bridge image, each its command
	// (consume too, though its profile is off by default).
	for _, s := range p.AllServices() {
		isBridge := s.Build != nil && s.Build.Target == "bridge"
		_, listed := bridgeCommands[s.Name]
		if isBridge != listed {
			t.Errorf("service %s: builds the bridge image %v, checked as a bridge service %v (update bridgeCommands)", s.Name, isBridge, listed)
		}
		if listed && (len(s.Command) != 1 || s.Command[0] != s.Name) {
			t.Errorf("service %s runs %v, want [%s]", s.Name, s.Command, s.Name)
		}
	}
}

// Every variable a bridge service sets is one the binary reads, every
// variable its command requires is set, and the whole environment loads
// through config.Load and tracing.ConfigFromEnv as the command would.
func TestComposeBridgeEnvironment(t *testing.T) {
	t.Parallel()
	known := map[string]bool{}
	for _, v := range config.Vars() {
		known[v] = true
	}
	for _, v := range config.TracingVars {
		known[v] = true
	}
	for _, l := range layouts {
		p := load(t, l.env, l.profiles...)
		for name, needs := range bridgeCommands {
			s, err := p.GetService(name)
			if err != nil {
				continue // not in this layout (TestComposeDeliveryModes says which run)
			}
			env := environment(s)
			for k := range s.Environment {
				if !known[k] {
					t.Errorf("%s: %s sets %s, which the bridge does not read (config.Vars and config.TracingVars)", l.name, name, k)
				}
			}
			want := required[name]
			if name == "deliver" && env["WEBHOOK_FAST_LANE"] == "true" {
				want = append(slices.Clone(want), fastLaneRequired...)
			}
			for _, k := range want {
				if env[k] == "" {
					t.Errorf("%s: %s does not set %s, which `bridge %s` requires", l.name, name, k, name)
				}
			}
			if _, err := config.Load(env, needs); err != nil {
				t.Errorf("%s: %s: its environment does not load: %v", l.name, name, err)
			}
			if _, err := tracing.ConfigFromEnv(func(k string) string { return env[k] }, "x"); err != nil {
				t.Errorf("%s: %s: its OTEL_* variables do not load: %v", l.name, name, err)
			}
		}
	}
}

// The file runs the fast lane by default: relay and deliver, no consume
// (which would refuse to start), deliver a member of the consumer group.
// WEBHOOK_FAST_LANE=false with the row-engine profile runs today's row
// engine: consume beside deliver, both with the fast lane off, in the group
// the fast lane used (so the switch continues from its offsets).
func TestComposeDeliveryModes(t *testing.T) {
	t.Parallel()
	fastLaneOf := func(p *types.Project, name string) bool {
		t.Helper()
		cfg, err := config.Load(environment(service(t, p, name)), config.Needs{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return cfg.Webhook.FastLane
	}
	p := load(t, nil)
	if _, err := p.GetService("consume"); err == nil {
		t.Error("`docker compose up` runs consume, which refuses to start on the fast lane")
	}
	if !slices.Contains(p.DisabledServices["consume"].Profiles, rowEngineProfile) {
		t.Errorf("consume is not in the %s profile", rowEngineProfile)
	}
	if !fastLaneOf(p, "deliver") {
		t.Error("`docker compose up`: deliver does not run the fast lane")
	}
	deliver := environment(service(t, p, "deliver"))
	if deliver["CONSUMER_TOPICS"] == "" || deliver["KAFKA_BROKERS"] == "" {
		t.Errorf("deliver on the fast lane reads no topics: CONSUMER_TOPICS=%q KAFKA_BROKERS=%q", deliver["CONSUMER_TOPICS"], deliver["KAFKA_BROKERS"])
	}
	if d := service(t, p, "deliver").DependsOn["kafka"]; d.Condition != types.ServiceConditionHealthy {
		t.Errorf("deliver depends on kafka with %q, want %s", d.Condition, types.ServiceConditionHealthy)
	}

	row := load(t, rowEngine, rowEngineProfile)
	if fastLaneOf(row, "deliver") || fastLaneOf(row, "consume") {
		t.Error("WEBHOOK_FAST_LANE=false --profile row-engine: deliver or consume still runs the fast lane")
	}
	consume := environment(service(t, row, "consume"))
	rowDeliver := environment(service(t, row, "deliver"))
	cfgConsume, err := config.Load(consume, bridgeCommands["consume"])
	if err != nil {
		t.Fatal(err)
	}
	cfgDeliver, err := config.Load(deliver, bridgeCommands["deliver"])
	if err != nil {
		t.Fatal(err)
	}
	if cfgConsume.Consumer.Group != cfgDeliver.Consumer.Group || !slices.Equal(cfgConsume.Consumer.Topics, cfgDeliver.Consumer.Topics) {
		t.Errorf("consume reads %v as group %s, the fast lane %v as group %s: switching would start over or split the topics",
			cfgConsume.Consumer.Topics, cfgConsume.Consumer.Group, cfgDeliver.Consumer.Topics, cfgDeliver.Consumer.Group)
	}
	if rowDeliver["ADMIN_TOKEN"] != deliver["ADMIN_TOKEN"] || rowDeliver["BRIDGE_SECRET_KEYS"] != deliver["BRIDGE_SECRET_KEYS"] {
		t.Error("the row engine's deliver differs from the fast lane's in more than WEBHOOK_FAST_LANE")
	}

	// The profile without the variable: consume gets the fast lane's
	// setting, so it refuses to start (exit 2 naming WEBHOOK_FAST_LANE)
	// instead of sharing the group with a fast-lane deliverer.
	half := load(t, nil, rowEngineProfile)
	if fastLaneOf(half, "consume") != fastLaneOf(half, "deliver") {
		t.Error("--profile row-engine without WEBHOOK_FAST_LANE=false: consume and deliver disagree on WEBHOOK_FAST_LANE")
	}
}

// The compose file's default admin token is a development one, but not so
// short that the bridge's own warning fires on every start of it.
func TestComposeAdminTokenIsLongEnough(t *testing.T) {
	t.Parallel()
	p := load(t, nil)
	seen := 0
	for _, s := range p.Services {
		if tok, ok := environment(s)["ADMIN_TOKEN"]; ok {
			seen++
			if len(tok) < adminapi.MinTokenLength {
				t.Errorf("%s: ADMIN_TOKEN %q is shorter than %d characters (the bridge warns at start)", s.Name, tok, adminapi.MinTokenLength)
			}
		}
	}
	if seen == 0 {
		t.Fatal("no service sets ADMIN_TOKEN")
	}
}

// The compose file's default key ring is the published development key
// (which start-up warns about), and BRIDGE_SECRET_KEYS from the shell
// replaces it.
func TestComposeKeyRingIsTheDevKeyUnlessSet(t *testing.T) {
	t.Parallel()
	if got := environment(service(t, load(t, nil), "deliver"))["BRIDGE_SECRET_KEYS"]; got != keyring.DevKeys {
		t.Errorf("deliver's default BRIDGE_SECRET_KEYS is %q, want the published dev key %q", got, keyring.DevKeys)
	}
	const own = "k1:QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE="
	if got := environment(service(t, load(t, map[string]string{"BRIDGE_SECRET_KEYS": own}), "deliver"))["BRIDGE_SECRET_KEYS"]; got != own {
		t.Errorf("BRIDGE_SECRET_KEYS=%q from the shell gives deliver %q", own, got)
	}
}

// The values point at each other: the database of the postgres service,
// the broker's advertised internal listener, ports that are published from
// where HTTP_ADDR listens, the receiver's token and admin API.
func TestComposeWiring(t *testing.T) {
	t.Parallel()
	p := load(t, nil)
	pg := environment(service(t, p, "postgres"))
	kafka := environment(service(t, p, "kafka"))
	advertised := strings.Split(kafka["KAFKA_ADVERTISED_LISTENERS"], ",")
	// Every bridge service of either layout (consume only runs in the row
	// engine's).
	for name := range bridgeCommands {
		s, err := load(t, rowEngine, rowEngineProfile).GetService(name)
		if err != nil {
			t.Fatalf("docker-compose.yml: %v", err)
		}
		env := environment(s)
		u, err := url.Parse(env["DATABASE_URL"])
		if err != nil {
			t.Fatalf("%s: DATABASE_URL: %v", name, err)
		}
		pw, _ := u.User.Password()
		if u.Hostname() != "postgres" || u.User.Username() != pg["POSTGRES_USER"] || pw != pg["POSTGRES_PASSWORD"] || strings.TrimPrefix(u.Path, "/") != pg["POSTGRES_DB"] {
			t.Errorf("%s: DATABASE_URL %s is not the postgres service's database", name, config.RedactURL(env["DATABASE_URL"]))
		}
		if b := env["KAFKA_BROKERS"]; b != "" {
			for _, broker := range strings.Split(b, ",") {
				if !slices.ContainsFunc(advertised, func(l string) bool { return strings.HasSuffix(l, "://"+broker) }) {
					t.Errorf("%s: KAFKA_BROKERS %s is not a listener kafka advertises (%v)", name, broker, advertised)
				}
			}
		}
		if len(s.Ports) > 0 {
			host, port, err := net.SplitHostPort(env["HTTP_ADDR"])
			if err != nil {
				t.Errorf("%s publishes ports but HTTP_ADDR=%q is not host:port", name, env["HTTP_ADDR"])
				continue
			}
			if host != "" && host != "0.0.0.0" && host != "::" {
				t.Errorf("%s: HTTP_ADDR=%s listens on %s only; the published port cannot reach it", name, env["HTTP_ADDR"], host)
			}
			if strconv.Itoa(int(s.Ports[0].Target)) != port {
				t.Errorf("%s publishes container port %d, HTTP_ADDR listens on %s", name, s.Ports[0].Target, port)
			}
		}
	}
	deliver := environment(service(t, p, "deliver"))
	receiver := environment(service(t, p, "receiver"))
	if deliver["ADMIN_TOKEN"] == "" || receiver["ADMIN_TOKEN"] != deliver["ADMIN_TOKEN"] {
		t.Errorf("receiver's ADMIN_TOKEN %q is not deliver's %q", receiver["ADMIN_TOKEN"], deliver["ADMIN_TOKEN"])
	}
	_, port, _ := net.SplitHostPort(deliver["HTTP_ADDR"])
	if receiver["ADMIN_API"] != "http://deliver:"+port {
		t.Errorf("receiver's ADMIN_API %q is not deliver's HTTP_ADDR (port %s)", receiver["ADMIN_API"], port)
	}
	ru, err := url.Parse(receiver["RECEIVER_URL"])
	_, rport, _ := net.SplitHostPort(receiver["RECEIVER_ADDR"])
	if err != nil || ru.Hostname() != "receiver" || ru.Port() != rport {
		t.Errorf("RECEIVER_URL %q does not reach the receiver on RECEIVER_ADDR %q", receiver["RECEIVER_URL"], receiver["RECEIVER_ADDR"])
	}
	if deliver["WEBHOOK_ALLOW_HTTP"] != "true" || ru.Scheme != "http" {
		t.Errorf("the receiver is %s but deliver has WEBHOOK_ALLOW_HTTP=%q", ru.Scheme, deliver["WEBHOOK_ALLOW_HTTP"])
	}
	topics := deliver["CONSUMER_TOPICS"]
	if !strings.Contains(topics, "assets") {
		t.Errorf("deliver reads %q; the file's example enqueues to assets", topics)
	}

	// ADMIN_TOKEN from the host reaches both ends.
	p = load(t, map[string]string{"ADMIN_TOKEN": "from-host"})
	for _, name := range []string{"deliver", "receiver"} {
		if got := environment(service(t, p, name))["ADMIN_TOKEN"]; got != "from-host" {
			t.Errorf("ADMIN_TOKEN=from-host: %s gets %q", name, got)
		}
	}
}

// The Dockerfile builds the targets the compose file asks for, statically,
// into distroless images running as non-root, with the bridge as the
// default target.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	f, err := os.Open(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type stage struct {
		from  string
		user  string
		lines []string
	}
	stages := map[string]*stage{}
	var order []string
	var cur *stage
	var all []string
	fromRe := regexp.MustCompile(`(?i)^FROM\s+(\S+)(?:\s+AS\s+(\S+))?`)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		all = append(all, line)
		if m := fromRe.FindStringSubmatch(line); m != nil {
			cur = &stage{from: m[1]}
			stages[m[2]] = cur
			order = append(order, m[2])
			continue
		}
		if cur == nil {
			continue
		}
		cur.lines = append(cur.lines, line)
		if u, ok := strings.CutPrefix(line, "USER "); ok {
			cur.user = u
		}
	}
	text := strings.Join(all, "\n")
	if !strings.Contains(text, "ARG GO_VERSION=1.26") || stages["source"] == nil || stages["source"].from != "golang:${GO_VERSION}" {
		t.Errorf("the build stage is not golang:1.26")
	}
	if !strings.Contains(text, "CGO_ENABLED=0") {
		t.Error("the Dockerfile does not build with CGO_ENABLED=0")
	}
	if order[len(order)-1] != "bridge" {
		t.Errorf("the last stage is %q: a plain docker build should produce the bridge", order[len(order)-1])
	}
	p := load(t, nil)
	for _, s := range p.Services {
		if s.Build == nil {
			continue
		}
		st := stages[s.Build.Target]
		if st == nil {
			t.Errorf("%s builds target %q, which the Dockerfile lacks", s.Name, s.Build.Target)
			continue
		}
		if !strings.HasPrefix(st.from, "gcr.io/distroless/static") || !strings.HasSuffix(st.from, ":nonroot") {
			t.Errorf("target %s is FROM %s, want distroless/static:nonroot", s.Build.Target, st.from)
		}
		if st.user != "65532:65532" && st.user != "65532" && st.user != "nonroot" {
			t.Errorf("target %s runs as %q, want 65532 (nonroot)", s.Build.Target, st.user)
		}
	}
	// Every package the Dockerfile builds exists.
	for _, m := range regexp.MustCompile(`\s(\./[\w/]+)`).FindAllStringSubmatch(text, -1) {
		if _, err := os.Stat(filepath.Join(root, m[1], "main.go")); err != nil {
			t.Errorf("the Dockerfile builds %s: %v", m[1], err)
		}
	}
	// The build context keeps what the build embeds.
	ignore, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(ignore), "\n") {
		line = strings.TrimSpace(line)
		for _, needed := range []string{"go.mod", "go.sum", "cmd", "internal", "api", "migrations", "outbox", "deploy"} {
			if line != "" && !strings.HasPrefix(line, "#") {
				if ok, _ := filepath.Match(line, needed); ok {
					t.Errorf(".dockerignore %q excludes %s, which the build needs", line, needed)
				}
			}
		}
	}
}

// The compose PostgreSQL runs with the server settings scripts/services-up.sh
// gives the cluster it owns (PG_SETTINGS there says why each is set), so the
// two local setups measure the same server. max_connections is the script's
// own need (parallel tests), not the compose stack's.
func TestComposePostgresSettingsMatchServicesUp(t *testing.T) {
	t.Parallel()
	script, err := os.ReadFile(filepath.Join(root, "scripts", "services-up.sh"))
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile(`(?s)\nPG_SETTINGS=\((.*?)\n\)`).FindSubmatch(script)
	if block == nil {
		t.Fatal("scripts/services-up.sh has no PG_SETTINGS=( … ) block")
	}
	var want []string
	for _, m := range regexp.MustCompile(`"(\w+) = ([^"$]+)"`).FindAllSubmatch(block[1], -1) {
		want = append(want, string(m[1])+"="+string(m[2]))
	}
	if len(want) == 0 {
		t.Fatalf("no literal settings in PG_SETTINGS:%s", block[1])
	}
	cmd := service(t, load(t, nil), "postgres").Command
	var got []string
	for i := 0; i+1 < len(cmd); i++ {
		if cmd[i] == "-c" {
			got = append(got, cmd[i+1])
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("postgres command sets %q, services-up.sh's PG_SETTINGS %q", got, want)
	}
}
