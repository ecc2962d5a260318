#!/usr/bin/env bash
# Starts the local services the tests, benchmarks and demo need, without
# Docker:
#
#   postgres  PostgreSQL (Debian package), 127.0.0.1:5432, role/db "bridge"
#   kafka     Apache Kafka 4.1.1 broker (KRaft, single combined node) from the
#             jars Maven resolves for scripts/kafka/pom.xml, 127.0.0.1:9092
#   jaeger    Jaeger v2 all-in-one (in-memory), built from tools/jaeger
#             (Go module github.com/jaegertracing/jaeger v1.76.0 is the
#             Jaeger v2.13.0 release): OTLP gRPC 4317, OTLP HTTP 4318,
#             query API/UI 16686
#
# Idempotent: a service whose port already answers is left alone, and the
# Kafka jars and the Jaeger binary are cached under
# ${OUTBOX_BRIDGE_CACHE:-$HOME/.cache/outbox-bridge}, so a second run is fast.
# Pids, logs and Kafka data live in ${OUTBOX_BRIDGE_STATE:-<cache>/state}.
#
# SERVICES="postgres kafka" selects a subset (default: all three).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${OUTBOX_BRIDGE_CACHE:-$HOME/.cache/outbox-bridge}"
STATE="${OUTBOX_BRIDGE_STATE:-$CACHE/state}"
SERVICES="${SERVICES:-postgres kafka jaeger}"

KAFKA_VERSION=4.1.1
KAFKA_HOME="$CACHE/kafka-$KAFKA_VERSION"
KAFKA_STATE="$STATE/kafka"
# Fixed cluster id (base64 of a random UUID; what `StorageTool random-uuid`
# prints): the data dir is formatted once, so a fixed id keeps restarts
# consistent without another JVM start.
KAFKA_CLUSTER_ID=I-GhyoEGSrW0AmIIXoF9Cg
KAFKA_READY_TIMEOUT="${KAFKA_READY_TIMEOUT:-90}"

JAEGER_STATE="$STATE/jaeger"
JAEGER_READY_TIMEOUT="${JAEGER_READY_TIMEOUT:-60}"

PG_PORT=5432
DATABASE_URL="postgres://bridge:bridge@127.0.0.1:$PG_PORT/bridge?sslmode=disable"

log() { printf '[services-up] %s\n' "$*" >&2; }
die() { printf '[services-up] ERROR: %s\n' "$*" >&2; exit 1; }

want() { [[ " $SERVICES " == *" $1 "* ]]; }

# port_open PORT: true when something accepts TCP connections on 127.0.0.1:PORT.
port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

as_root() {
	if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}
as_postgres() {
	# From / so that psql does not complain about an unreadable cwd.
	(cd / && if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi)
}

apt_install() {
	log "installing $* with apt-get"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# elapsed START: seconds since START (a $SECONDS value).
elapsed() { echo "$((SECONDS - $1))s"; }

# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------

pg_version() {
	# Highest installed server version (directory names under /usr/lib/postgresql).
	local d v best=""
	for d in /usr/lib/postgresql/*/bin/postgres; do
		[[ -x $d ]] || continue
		v="${d#/usr/lib/postgresql/}"
		v="${v%%/*}"
		if [[ -z $best ]] || ((v > best)); then best=$v; fi
	done
	echo "$best"
}

pg_psql() { as_postgres psql -X -q -v ON_ERROR_STOP=1 -p "$PG_PORT" "$@"; }

start_postgres() {
	local t0=$SECONDS ver cluster status
	if ! command -v pg_ctlcluster >/dev/null || [[ -z $(pg_version) ]]; then
		apt_install postgresql
	fi
	ver="$(pg_version)"
	[[ -n $ver ]] || die "no PostgreSQL server binaries found after installing postgresql"

	# Use the cluster of that version on port 5432 if there is one, else the
	# first cluster of that version, else create one.
	cluster="$(pg_lsclusters -h | awk -v v="$ver" -v p="$PG_PORT" '$1 == v && $3 == p {print $2; exit}')"
	if [[ -z $cluster ]]; then
		cluster="$(pg_lsclusters -h | awk -v v="$ver" '$1 == v {print $2; exit}')"
	fi
	if [[ -z $cluster ]]; then
		log "creating PostgreSQL $ver cluster 'main' on port $PG_PORT"
		as_root pg_createcluster "$ver" main --port "$PG_PORT" >/dev/null
		cluster=main
	fi
	local port
	port="$(pg_lsclusters -h | awk -v v="$ver" -v c="$cluster" '$1 == v && $2 == c {print $3}')"
	[[ $port == "$PG_PORT" ]] || die "PostgreSQL cluster $ver/$cluster uses port $port, not $PG_PORT; fix it (pg_conftool $ver $cluster set port $PG_PORT) or free the port"

	status="$(pg_lsclusters -h | awk -v v="$ver" -v c="$cluster" '$1 == v && $2 == c {print $4}')"
	if [[ $status != online* ]]; then
		if port_open "$PG_PORT"; then
			log "port $PG_PORT answers but cluster $ver/$cluster is not running: leaving whatever listens there alone"
			return 0
		fi
		log "starting PostgreSQL $ver/$cluster"
		as_root pg_ctlcluster "$ver" "$cluster" start
	fi

	# Tests run in parallel, each with its own pool: raise max_connections.
	# Changing it needs a restart, so only do that when the value differs.
	local maxconn
	maxconn="$(pg_psql -tAc 'SHOW max_connections')"
	if [[ $maxconn != 300 ]]; then
		log "max_connections is $maxconn: setting 300 and restarting PostgreSQL $ver/$cluster"
		pg_psql -c 'ALTER SYSTEM SET max_connections = 300'
		as_root pg_ctlcluster "$ver" "$cluster" restart
	fi

	local i
	for ((i = 0; i < 30; i++)); do
		pg_isready -q -h 127.0.0.1 -p "$PG_PORT" && break
		sleep 1
	done
	pg_isready -q -h 127.0.0.1 -p "$PG_PORT" || die "PostgreSQL does not accept connections on 127.0.0.1:$PG_PORT (see /var/log/postgresql/postgresql-$ver-$cluster.log)"

	# Role and database, idempotently. SUPERUSER: test helpers create
	# databases and schemas of their own.
	pg_psql -d postgres <<-'SQL'
		DO $$
		BEGIN
			IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'bridge') THEN
				CREATE ROLE bridge LOGIN SUPERUSER PASSWORD 'bridge';
			ELSE
				ALTER ROLE bridge LOGIN SUPERUSER PASSWORD 'bridge';
			END IF;
		END
		$$;
	SQL
	if [[ -z $(pg_psql -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'bridge'") ]]; then
		pg_psql -d postgres -c 'CREATE DATABASE bridge OWNER bridge'
	fi
	PGPASSWORD=bridge psql -X -q "$DATABASE_URL" -tAc 'SELECT 1' >/dev/null ||
		die "cannot connect as bridge to $DATABASE_URL"
	log "PostgreSQL $ver/$cluster ready on 127.0.0.1:$PG_PORT ($(elapsed "$t0"))"
}

# ---------------------------------------------------------------------------
# Kafka
# ---------------------------------------------------------------------------

ensure_java() {
	if ! command -v java >/dev/null; then
		apt_install openjdk-17-jre-headless
	fi
	local major
	major="$(java -version 2>&1 | awk -F'"' '/version/ {split($2, a, "."); print a[1]; exit}')"
	[[ ${major:-0} -ge 17 ]] || die "Kafka $KAFKA_VERSION needs Java 17+, found Java ${major:-unknown}"
}

# The jars are keyed by Kafka version and by the content of the pom, so an
# edited pom re-resolves and an unchanged one never runs Maven again.
kafka_libs() {
	local pom="$ROOT/scripts/kafka/pom.xml" sum stamp="$KAFKA_HOME/libs/.pom.sha256"
	sum="$(sha256sum "$pom" | cut -d' ' -f1)"
	if [[ -f $stamp && $(cat "$stamp") == "$sum" ]]; then
		return 0
	fi
	command -v mvn >/dev/null || apt_install maven
	local t0=$SECONDS tmp="$KAFKA_HOME/libs.tmp"
	log "resolving Kafka $KAFKA_VERSION jars with Maven into $KAFKA_HOME/libs"
	rm -rf "$tmp"
	mkdir -p "$tmp"
	mkdir -p "$STATE"
	if ! mvn -B -ntp -Dstyle.color=never -f "$pom" dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory="$tmp" >"$STATE/kafka-mvn.log" 2>&1; then
		tail -n 40 "$STATE/kafka-mvn.log" >&2
		die "mvn could not resolve the Kafka jars (scripts/kafka/pom.xml); full log: $STATE/kafka-mvn.log"
	fi
	ls "$tmp"/kafka_2.13-"$KAFKA_VERSION".jar >/dev/null 2>&1 ||
		die "kafka_2.13-$KAFKA_VERSION.jar missing after Maven resolution"
	echo "$sum" >"$tmp/.pom.sha256"
	rm -rf "$KAFKA_HOME/libs"
	mv "$tmp" "$KAFKA_HOME/libs"
	log "Kafka jars resolved: $(ls "$KAFKA_HOME/libs" | wc -l) jars ($(elapsed "$t0"))"
}

kafka_java() {
	java -cp "$KAFKA_HOME/libs/*" \
		-Dlog4j2.configurationFile="$ROOT/scripts/kafka/log4j2-tools.properties" \
		"$@"
}

write_kafka_config() {
	mkdir -p "$KAFKA_STATE/data" "$KAFKA_STATE/logs"
	cat >"$KAFKA_STATE/server.properties.tmp" <<-EOF
		# Generated by scripts/services-up.sh: single-node KRaft (broker+controller).
		process.roles=broker,controller
		node.id=1
		controller.quorum.voters=1@127.0.0.1:9093
		listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093
		advertised.listeners=PLAINTEXT://127.0.0.1:9092
		controller.listener.names=CONTROLLER
		listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
		inter.broker.listener.name=PLAINTEXT
		log.dirs=$KAFKA_STATE/data
		num.partitions=3
		default.replication.factor=1
		offsets.topic.replication.factor=1
		offsets.topic.num.partitions=10
		share.coordinator.state.topic.replication.factor=1
		share.coordinator.state.topic.min.isr=1
		transaction.state.log.replication.factor=1
		transaction.state.log.min.isr=1
		transaction.state.log.num.partitions=10
		group.initial.rebalance.delay.ms=0
		auto.create.topics.enable=true
		delete.topic.enable=true
		num.network.threads=3
		num.io.threads=4
		log.retention.hours=24
		log.segment.bytes=104857600
	EOF
	mv "$KAFKA_STATE/server.properties.tmp" "$KAFKA_STATE/server.properties"
}

kafka_log_tail() {
	{
		echo "---- last lines of $KAFKA_STATE/logs/server.log ----"
		tail -n 40 "$KAFKA_STATE/logs/server.log" 2>/dev/null || true
		echo "---- last lines of $KAFKA_STATE/logs/kafka.out ----"
		tail -n 20 "$KAFKA_STATE/logs/kafka.out" 2>/dev/null || true
	} >&2
}

start_kafka() {
	local t0=$SECONDS
	if port_open 9092; then
		log "Kafka: 127.0.0.1:9092 already answers, leaving it alone"
		return 0
	fi
	ensure_java
	kafka_libs
	write_kafka_config

	if [[ ! -f $KAFKA_STATE/data/meta.properties ]]; then
		log "formatting Kafka storage in $KAFKA_STATE/data (cluster id $KAFKA_CLUSTER_ID)"
		kafka_java kafka.tools.StorageTool format -t "$KAFKA_CLUSTER_ID" \
			-c "$KAFKA_STATE/server.properties" >"$KAFKA_STATE/logs/format.out" 2>&1 || {
			cat "$KAFKA_STATE/logs/format.out" >&2
			die "formatting Kafka storage failed"
		}
	fi

	log "starting Kafka $KAFKA_VERSION (log: $KAFKA_STATE/logs/server.log)"
	cd "$KAFKA_STATE"
	# setsid: the broker outlives this script and the make/CI process group.
	nohup setsid java -Xms256m -Xmx512m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
		-Djava.awt.headless=true \
		-Dkafka.logs.dir="$KAFKA_STATE/logs" \
		-Dlog4j2.configurationFile="$ROOT/scripts/kafka/log4j2.properties" \
		-cp "$KAFKA_HOME/libs/*" \
		kafka.Kafka "$KAFKA_STATE/server.properties" \
		>"$KAFKA_STATE/logs/kafka.out" 2>&1 </dev/null &
	local pid=$!
	echo "$pid" >"$KAFKA_STATE/kafka.pid"
	cd "$ROOT"

	# Ready = the port answers and the broker serves a metadata request
	# (TopicCommand --list goes through the admin client).
	local deadline=$((SECONDS + KAFKA_READY_TIMEOUT))
	while ! port_open 9092; do
		if ! kill -0 "$pid" 2>/dev/null; then
			kafka_log_tail
			die "Kafka exited during startup"
		fi
		if ((SECONDS >= deadline)); then
			kafka_log_tail
			die "Kafka did not open 127.0.0.1:9092 within ${KAFKA_READY_TIMEOUT}s"
		fi
		sleep 0.5
	done
	until kafka_java org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:9092 \
		--list >/dev/null 2>"$KAFKA_STATE/logs/ready-check.err"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			kafka_log_tail
			die "Kafka exited during startup"
		fi
		if ((SECONDS >= deadline)); then
			cat "$KAFKA_STATE/logs/ready-check.err" >&2 || true
			kafka_log_tail
			die "Kafka did not answer a topic listing within ${KAFKA_READY_TIMEOUT}s"
		fi
		sleep 1
	done
	log "Kafka $KAFKA_VERSION ready on 127.0.0.1:9092, pid $pid ($(elapsed "$t0"))"
}

# ---------------------------------------------------------------------------
# Jaeger
# ---------------------------------------------------------------------------

jaeger_version() {
	awk '$1 == "github.com/jaegertracing/jaeger" {print $2; exit}' "$ROOT/tools/jaeger/go.mod"
}

jaeger_ready() {
	curl -sf -o /dev/null --max-time 2 http://127.0.0.1:16686/api/services && port_open 4318
}

start_jaeger() {
	local t0=$SECONDS
	command -v curl >/dev/null || apt_install curl ca-certificates
	if jaeger_ready; then
		log "Jaeger: 127.0.0.1:16686 and :4318 already answer, leaving it alone"
		return 0
	fi
	if port_open 16686 || port_open 4318 || port_open 4317; then
		die "a Jaeger port (4317/4318/16686) is taken, but no Jaeger answers there"
	fi
	local ver bin
	ver="$(jaeger_version)"
	[[ -n $ver ]] || die "cannot read the Jaeger version from tools/jaeger/go.mod"
	bin="$CACHE/jaeger-$ver/jaeger"
	if [[ ! -x $bin ]]; then
		command -v go >/dev/null || die "go is needed to build Jaeger (tools/jaeger)"
		log "building Jaeger $ver from tools/jaeger into $bin (takes several minutes the first time)"
		mkdir -p "$(dirname "$bin")"
		(cd "$ROOT/tools/jaeger" && go build -o "$bin.tmp" github.com/jaegertracing/jaeger/cmd/jaeger) ||
			die "building Jaeger failed"
		mv "$bin.tmp" "$bin"
		log "Jaeger built ($(elapsed "$t0"))"
	fi

	mkdir -p "$JAEGER_STATE"
	log "starting Jaeger $ver (log: $JAEGER_STATE/jaeger.log)"
	cd "$JAEGER_STATE"
	nohup setsid "$bin" >"$JAEGER_STATE/jaeger.log" 2>&1 </dev/null &
	local pid=$!
	echo "$pid" >"$JAEGER_STATE/jaeger.pid"
	cd "$ROOT"

	local deadline=$((SECONDS + JAEGER_READY_TIMEOUT))
	until jaeger_ready; do
		if ! kill -0 "$pid" 2>/dev/null || ((SECONDS >= deadline)); then
			echo "---- last lines of $JAEGER_STATE/jaeger.log ----" >&2
			tail -n 30 "$JAEGER_STATE/jaeger.log" >&2 || true
			die "Jaeger did not become ready (16686 /api/services and 4318) within ${JAEGER_READY_TIMEOUT}s"
		fi
		sleep 0.5
	done
	log "Jaeger $ver ready, pid $pid ($(elapsed "$t0"))"
}

# ---------------------------------------------------------------------------

for s in $SERVICES; do
	case $s in
	postgres | kafka | jaeger) ;;
	*) die "unknown service '$s' in SERVICES (known: postgres kafka jaeger)" ;;
	esac
done
mkdir -p "$CACHE" "$STATE"

want postgres && start_postgres
want kafka && start_kafka
want jaeger && start_jaeger

echo
echo "Services:"
want postgres && echo "  postgres  127.0.0.1:$PG_PORT  (role/db bridge, password bridge)"
want kafka && echo "  kafka     127.0.0.1:9092 (KRaft controller 127.0.0.1:9093), Kafka $KAFKA_VERSION, log $KAFKA_STATE/logs/server.log"
want jaeger && echo "  jaeger    OTLP gRPC 127.0.0.1:4317, OTLP HTTP 127.0.0.1:4318, UI/query http://127.0.0.1:16686, log $JAEGER_STATE/jaeger.log"
echo
echo "Environment:"
want postgres && echo "  export DATABASE_URL='$DATABASE_URL'"
want kafka && echo "  export KAFKA_BROKERS=127.0.0.1:9092"
if want jaeger; then
	echo "  export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318"
	echo "  export JAEGER_QUERY_URL=http://127.0.0.1:16686"
	echo "  export BRIDGE_TEST_JAEGER_OTLP=127.0.0.1:4318 BRIDGE_TEST_JAEGER_QUERY=http://127.0.0.1:16686"
fi
