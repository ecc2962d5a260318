# Outbox Bridge. Local services (PostgreSQL, Kafka 4.1.1, Jaeger v2) run
# without Docker: see scripts/services-up.sh.

GO ?= go

# The contract with the Go test helpers: these four variables point the
# integration tests at the services started by scripts/services-up.sh.
# The URL follows scripts/services-up.sh: it runs a cluster of its own on
# another port when the server on 5432 is someone else's, and records the URL.
# The shell reads it when the command line runs, never make: make expands a
# whole recipe before its first line runs, so a URL read by make in a recipe
# that starts the services is the one from before they started.
SERVICES_DATABASE_URL = "$$($(CURDIR)/scripts/services-up.sh --database-url)"
TEST_ENV = \
	DATABASE_URL=$(SERVICES_DATABASE_URL) \
	KAFKA_BROKERS=127.0.0.1:9092 \
	BRIDGE_TEST_JAEGER_OTLP=127.0.0.1:4318 \
	BRIDGE_TEST_JAEGER_QUERY=http://127.0.0.1:16686

.PHONY: fuzz all build services schema-registry services-down chromium console-screenshots test vet test-go test-deploy bench demo clean

all: build

build:
	$(GO) build -o bin/bridge ./cmd/bridge

services:
	scripts/services-up.sh

# The schema registry (Apicurio, built with Maven on first use): not in the
# default services. The schema tests start it themselves when it is down;
# `make test` starts it first so that the first build runs once, before the
# test packages that need it run in parallel.
schema-registry:
	SERVICES=schema-registry scripts/services-up.sh

services-down:
	scripts/services-down.sh

# The console's browser tests (internal/console) drive Debian's chromium,
# headless; installed here when missing, the way services-up.sh installs
# PostgreSQL (under CI=true a missing browser fails those tests).
chromium:
	@command -v chromium >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then S=; else S=sudo; fi; \
		echo "installing chromium with apt-get" >&2; \
		$$S env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$$S env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null; }

# Regenerates docs/console/*.png with the console's browser tests, which
# first check that each page still renders what docs/console.md says it does.
console-screenshots: services chromium
	env $(TEST_ENV) BRIDGE_CONSOLE_SCREENSHOTS='$(CURDIR)/docs/console' $(GO) test -count=1 -timeout 15m \
		-run '^(TestConsoleInBrowser|TestConsoleActionsInBrowser)$$' ./internal/console/

# ALONE_TESTS run after the rest of the suite, by themselves, because what
# they bound is a time the machine's load stretches. The consumer group's
# stall after a SIGKILL is the session timeout (6 s) plus a rejoin of a few
# round trips to the broker and one batch through PostgreSQL; with the whole
# suite beside it on 2 cores the broker's answers slow down enough to push
# the stall past its 10 s bound, a measurement of the machine rather than of
# the group. The relay's trickle rule is the same kind of bound: it stays
# busy while rows keep coming within 20 ms of each other, so a relay starved
# of the CPU for longer by the suite beside it goes to wait and its writers'
# commits notify it, past the test's bound of a quarter of them. -p 1: the
# packages of ALONE_TESTS run one after the other, not beside each other.
ALONE_TESTS = ^(TestConsumerStallAfterSIGKILL|TestSteadyTrickleIsRelayedWithoutNotifications)$$
ALONE_PACKAGES = ./internal/chaos/ ./internal/relay/

# Starts the services, then vet, the race-enabled test suite (ALONE_TESTS
# last, by themselves), and every benchmark once (so they compile and run).
test: services schema-registry chromium
	$(GO) vet ./...
	env $(TEST_ENV) $(GO) test -race -count=1 -timeout 25m -skip '$(ALONE_TESTS)' ./...
	env $(TEST_ENV) $(GO) test -race -count=1 -timeout 5m -p 1 -run '$(ALONE_TESTS)' $(ALONE_PACKAGES)
	env $(TEST_ENV) $(GO) test -run '^$$' -bench . -benchtime 1x ./...
	scripts/fuzz.sh
	$(MAKE) --no-print-directory test-deploy

vet:
	$(GO) vet ./...

test-go:
	env $(TEST_ENV) $(GO) test -race -count=1 -timeout 25m -skip '$(ALONE_TESTS)' ./...
	env $(TEST_ENV) $(GO) test -race -count=1 -timeout 5m -p 1 -run '$(ALONE_TESTS)' $(ALONE_PACKAGES)

# The Helm chart (rendered, linted, strictly decoded), the alert rules
# (promtool check/test) and the Grafana dashboard: tools/deploytest, a module
# of its own so Helm, Kubernetes and Prometheus stay out of go.mod. Needs the
# services (make services): it checks the names on a running bridge's /metrics.
test-deploy:
	cd tools/deploytest && env $(TEST_ENV) $(GO) test -count=1 -timeout 15m ./...

bench:
	env $(TEST_ENV) $(GO) test -run '^$$' -bench . -benchtime 1x ./...

demo:
	SERVICES=postgres scripts/services-up.sh
	env DATABASE_URL=$(SERVICES_DATABASE_URL) $(GO) run ./cmd/bridge demo

clean:
	rm -rf bin

# The fault suite (internal/chaos): SIGKILLs of every process type, broker,
# receiver and PostgreSQL outages, a PostgreSQL failover and a three-broker
# cluster losing its leader, judged from outside the pipeline. Its short
# variant is part of `make test` (go test ./... runs it; it starts its own
# PostgreSQL instances, its own broker and the kafka-cluster service);
# `make chaos` is the long variant, with a rolling restart of the cluster.
# CHAOS_REPORT=file appends each run's measurements as a JSON line.
.PHONY: chaos chaos-short
chaos: services build
	env $(TEST_ENV) CHAOS=long $(GO) test -count=1 -timeout 60m -v ./internal/chaos/...

chaos-short: services build
	env $(TEST_ENV) $(GO) test -count=1 -timeout 15m -v ./internal/chaos/...

# Every fuzz target for FUZZTIME each (make test runs them for 8s each).
fuzz:
	FUZZTIME=$${FUZZTIME:-2m} scripts/fuzz.sh
