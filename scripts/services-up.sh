#!/usr/bin/env bash
# Starts the local services the tests, benchmarks and demo need, without
# Docker:
#
#   postgres       PostgreSQL (Debian package), 127.0.0.1:5432, role/db "bridge"
#   kafka          Apache Kafka 4.1.1 broker (KRaft, single combined node) from
#                  the jars Maven resolves for scripts/kafka/pom.xml, 127.0.0.1:9092
#   jaeger         Jaeger v2 all-in-one (in-memory), built from tools/jaeger
#                  (Go module github.com/jaegertracing/jaeger v1.76.0 is the
#                  Jaeger v2.13.0 release): OTLP gRPC 4317, OTLP HTTP 4318,
#                  query API/UI 16686
#   kafka-cluster  three KRaft nodes (each broker+controller) from the same jars,
#                  brokers 127.0.0.1:19092,19093,19094 (controllers 19192-19194);
#                  topics default to replication factor 3, min.insync.replicas 2.
#                  Not in the default set: the chaos tests start it themselves.
#   schema-registry  Apicurio Registry 2.4.2.Final (Confluent-compatible API at
#                  http://127.0.0.1:8081/apis/ccompat/v7), built with Maven from
#                  scripts/schema-registry, in memory. Not in the default set:
#                  the schema tests start it themselves.
#
# Idempotent: a service whose port already answers is left alone (for the
# cluster: a node whose port answers; missing nodes are started, which is how
# the chaos tests bring back a broker they killed), and the Kafka jars and the
# Jaeger binary are cached under ${OUTBOX_BRIDGE_CACHE:-$HOME/.cache/outbox-bridge},
# so a second run is fast. Pids, logs and Kafka data live in
# ${OUTBOX_BRIDGE_STATE:-<cache>/state}. Two runs at once wait for each other
# (a lock in the cache dir) instead of racing over the same data dirs.
#
# PostgreSQL: a server this script did not create is never changed. When the
# server on PG_PORT is someone else's and would need a change (max_connections,
# the bridge role or database), the script prints exactly what, leaves it
# alone, and runs a cluster of its own ("outbox-bridge", PG_DEDICATED_PORT,
# default 5433) instead; PG_ADOPT=yes applies the printed changes to the
# existing server instead. The URL to use is printed and recorded:
# `scripts/services-up.sh --database-url` prints it (the Makefile's tests and
# demo use that, so DATABASE_URL follows the dedicated cluster).
#
# Daemons are started with only stdin/stdout/stderr open (stdin /dev/null,
# output to their log): a lock or pipe held by whoever ran this script is not
# held for the daemon's lifetime.
#
# SERVICES="postgres kafka" selects a subset (default: postgres kafka jaeger).
# Overrides for running a second, separate instance (the tests do):
# PG_PORT, PG_DEDICATED_PORT, PG_CLUSTER (name of a cluster this script
# creates, default outbox-bridge), KAFKA_PORT, KAFKA_CONTROLLER_PORT,
# KAFKA_CLUSTER_PORTS ("19092 19093 19094"; controllers at port+100),
# SCHEMA_REGISTRY_PORT (8081),
# OUTBOX_BRIDGE_STATE.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${OUTBOX_BRIDGE_CACHE:-$HOME/.cache/outbox-bridge}"
STATE="${OUTBOX_BRIDGE_STATE:-$CACHE/state}"
SERVICES="${SERVICES:-postgres kafka jaeger}"

KAFKA_VERSION=4.1.1
KAFKA_HOME="$CACHE/kafka-$KAFKA_VERSION"
KAFKA_STATE="$STATE/kafka"
KAFKA_PORT="${KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
KAFKA_CLUSTER_PORTS="${KAFKA_CLUSTER_PORTS:-19092 19093 19094}"
KAFKA_CLUSTER_STATE="$STATE/kafka-cluster"
# Fixed cluster ids (base64 of a random UUID; what `StorageTool random-uuid`
# prints): a data dir is formatted once, so a fixed id keeps restarts
# consistent without another JVM start.
KAFKA_CLUSTER_ID=I-GhyoEGSrW0AmIIXoF9Cg
KAFKA_CLUSTER3_ID=Wc8Gq1yLTuyjzHq3c2vN4A
KAFKA_READY_TIMEOUT="${KAFKA_READY_TIMEOUT:-90}"

JAEGER_STATE="$STATE/jaeger"
JAEGER_READY_TIMEOUT="${JAEGER_READY_TIMEOUT:-60}"

PG_PORT="${PG_PORT:-5432}"
PG_DEDICATED_PORT="${PG_DEDICATED_PORT:-5433}"
PG_CLUSTER="${PG_CLUSTER:-outbox-bridge}"
PG_ADOPT="${PG_ADOPT:-no}"
PG_MAX_CONNECTIONS=300
# Server settings of a cluster this script owns (written to its conf.d file;
# a server it did not create is never changed). Debian's defaults are sized
# for a small shared host: shared_buffers = 128MB is smaller than what one
# five-minute `bench pipeline` keeps live in bridge.deliveries (~530 MB with
# its indexes), and max_wal_size = 1GB with checkpoint_timeout = 5min starts
# a checkpoint every few minutes under load, after which every page written
# is first logged whole (full-page images). These are the values a
# production server of this size would start from (docs/configuration.md says so for
# yours). shared_buffers needs a restart, the others a reload.
PG_SETTINGS=(
	"max_connections = $PG_MAX_CONNECTIONS"
	"shared_buffers = 1GB"
	"max_wal_size = 4GB"
	"checkpoint_timeout = 15min"
)
# The file that marks a cluster as created by this script (and holds its
# settings): /etc/postgresql/<ver>/<cluster>/conf.d/$PG_MARKER.
PG_MARKER=outbox-bridge.conf

log() { printf '[services-up] %s\n' "$*" >&2; }
die() { printf '[services-up] ERROR: %s\n' "$*" >&2; exit 1; }

want() { [[ " $SERVICES " == *" $1 "* ]]; }

pg_url() { echo "postgres://bridge:bridge@127.0.0.1:$1/bridge?sslmode=disable"; }
DATABASE_URL="$(pg_url "$PG_PORT")"

if [[ ${1:-} == --database-url ]]; then
	# The URL the last run recorded (a dedicated cluster moves it), else the
	# default; starts nothing.
	cat "$STATE/database_url" 2>/dev/null || echo "$DATABASE_URL"
	exit 0
fi

# port_open PORT: true when something accepts TCP connections on 127.0.0.1:PORT.
port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# close_fds: closes every descriptor above 2 of the current (sub)shell. Called
# in the subshell that then execs a daemon (or a tool that starts one, such as
# pg_ctlcluster), so a descriptor the caller holds — a flock'd lock file, the
# write end of a pipe someone reads to EOF — does not live on in the daemon.
close_fds() {
	local p fd
	for p in /proc/"$BASHPID"/fd/*; do
		fd="${p##*/}"
		[[ $fd =~ ^[0-9]+$ ]] || continue
		((fd > 2)) || continue
		exec {fd}>&-
	done
}

# daemon LOG CMD...: runs CMD in the background in a session of its own (it
# outlives this script and the make/CI process group), stdin /dev/null,
# stdout+stderr appended to LOG, no other descriptor inherited. Sets DAEMON_PID.
daemon() {
	local logfile=$1
	shift
	(
		close_fds
		exec setsid "$@" </dev/null >>"$logfile" 2>&1
	) &
	DAEMON_PID=$!
}

# closed CMD...: runs CMD in the foreground without the descriptors above 2
# (for pg_ctlcluster, which passes them on to the postmaster it starts).
closed() { (
	close_fds
	"$@"
); }

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

# pg_cluster_on PORT: "ver cluster status" of the Debian cluster configured on PORT.
pg_cluster_on() { pg_lsclusters -h 2>/dev/null | awk -v p="$1" '$3 == p {print $1, $2, $4; exit}'; }

pg_psql_port() {
	local port=$1
	shift
	as_postgres psql -X -q -v ON_ERROR_STOP=1 -p "$port" "$@"
}

pg_wait() {
	local port=$1 logf=$2 i
	for ((i = 0; i < 60; i++)); do
		pg_isready -q -h 127.0.0.1 -p "$port" && return 0
		sleep 0.5
	done
	die "PostgreSQL does not accept connections on 127.0.0.1:$port (see $logf)"
}

# pg_needs PORT OWN: prints, one per line, each change the server on PORT
# needs before the tests can use it (nothing when it is ready as it is).
# Read-only: connects as bridge/bridge over TCP, and for a Debian cluster
# inspects the roles as the postgres superuser.
pg_needs() {
	local port=$1 url out super maxconn
	url="$(pg_url "$port")"
	if out="$(PGPASSWORD=bridge PGCONNECT_TIMEOUT=5 psql -X -q "$url" -tAF' ' -c \
		"SELECT rolsuper, current_setting('max_connections') FROM pg_roles WHERE rolname = current_user" 2>&1)"; then
		read -r super maxconn <<<"$out"
		[[ $super == t ]] || echo "ALTER ROLE bridge SUPERUSER (the role exists; test helpers create databases)"
		((maxconn >= PG_MAX_CONNECTIONS)) ||
			echo "max_connections $maxconn -> $PG_MAX_CONNECTIONS (a restart of the server)"
		return 0
	fi
	if [[ -n $(pg_cluster_on "$port") ]]; then
		local role db
		role="$(pg_psql_port "$port" -d postgres -tAc "SELECT rolsuper FROM pg_roles WHERE rolname = 'bridge'" 2>/dev/null || true)"
		db="$(pg_psql_port "$port" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'bridge'" 2>/dev/null || true)"
		maxconn="$(pg_psql_port "$port" -d postgres -tAc 'SHOW max_connections' 2>/dev/null || echo 0)"
		if [[ -z $role ]]; then
			echo "CREATE ROLE bridge LOGIN SUPERUSER PASSWORD 'bridge'"
		else
			echo "ALTER ROLE bridge LOGIN SUPERUSER PASSWORD 'bridge' (the role exists: its password would be replaced)"
		fi
		[[ -n $db ]] || echo "CREATE DATABASE bridge OWNER bridge"
		((maxconn >= PG_MAX_CONNECTIONS)) ||
			echo "max_connections $maxconn -> $PG_MAX_CONNECTIONS (a restart of the server)"
	else
		echo "log in as bridge/bridge, which fails: ${out//$'\n'/ }"
	fi
}

# pg_own_cluster VER NAME PORT: creates (when missing), configures and starts a
# cluster this script owns, then sets up role and database. Every change to
# it is printed.
pg_own_cluster() {
	local ver=$1 name=$2 port=$3 conf status
	conf="/etc/postgresql/$ver/$name/conf.d/$PG_MARKER"
	local have
	have="$(pg_lsclusters -h | awk -v v="$ver" -v c="$name" '$1 == v && $2 == c {print $3}')"
	if [[ -n $have && $have != "$port" ]]; then
		die "PostgreSQL cluster $ver/$name exists on port $have, not $port; use PG_CLUSTER for another name or pg_dropcluster it"
	fi
	if [[ -z $have ]]; then
		log "creating PostgreSQL $ver cluster '$name' on port $port (a cluster of its own)"
		closed as_root pg_createcluster "$ver" "$name" --port "$port" >/dev/null
	fi
	local want_conf
	want_conf="$(printf '%s\n' \
		"# Written by outbox-bridge scripts/services-up.sh: this cluster is the script's own," \
		"# so the script may change it. Tests run in parallel, each with its own pool." \
		"${PG_SETTINGS[@]}")"
	if [[ ! -f $conf || "$(cat "$conf")" != "$want_conf" ]]; then
		log "writing $conf (${PG_SETTINGS[*]}; marks the cluster as this script's)"
		as_root mkdir -p "$(dirname "$conf")"
		printf '%s\n' "$want_conf" | as_root tee "$conf" >/dev/null
	fi
	status="$(pg_lsclusters -h | awk -v v="$ver" -v c="$name" '$1 == v && $2 == c {print $4}')"
	if [[ $status != online* ]]; then
		log "starting PostgreSQL $ver/$name"
		closed as_root pg_ctlcluster "$ver" "$name" start
	fi
	pg_wait "$port" "/var/log/postgresql/postgresql-$ver-$name.log"
	# A running server applies the file's settings at a reload, except those
	# that need a restart (max_connections, shared_buffers): compare what it
	# runs with against the file, and restart only when one of those differs.
	local running wanted
	running="$(pg_psql_port "$port" -tAF' ' -c "SELECT current_setting('max_connections'), current_setting('shared_buffers')")"
	wanted="$PG_MAX_CONNECTIONS $(printf '%s\n' "${PG_SETTINGS[@]}" | sed -n 's/^shared_buffers = //p')"
	if [[ $running != "$wanted" ]]; then
		log "max_connections, shared_buffers are $running: restarting PostgreSQL $ver/$name (own cluster) to apply $wanted"
		# ALTER SYSTEM would override conf.d; RESET it in our own cluster only.
		pg_psql_port "$port" -c 'ALTER SYSTEM RESET max_connections' -c 'ALTER SYSTEM RESET shared_buffers'
		closed as_root pg_ctlcluster "$ver" "$name" restart
		pg_wait "$port" "/var/log/postgresql/postgresql-$ver-$name.log"
	else
		pg_psql_port "$port" -tAc 'SELECT pg_reload_conf()' >/dev/null
	fi
	pg_setup_role "$port"
}

# pg_setup_role PORT: role and database, idempotently, printing what changes.
# SUPERUSER: test helpers create databases and schemas of their own.
pg_setup_role() {
	local port=$1 role
	role="$(pg_psql_port "$port" -d postgres -tAc "SELECT rolsuper FROM pg_roles WHERE rolname = 'bridge'")"
	if [[ -z $role ]]; then
		log "creating role bridge (LOGIN SUPERUSER, password bridge) on port $port"
		pg_psql_port "$port" -d postgres -c "CREATE ROLE bridge LOGIN SUPERUSER PASSWORD 'bridge'"
	elif ! PGPASSWORD=bridge PGCONNECT_TIMEOUT=5 psql -X -q "$(pg_url "$port")" -tAc 'SELECT 1' >/dev/null 2>&1 || [[ $role != t ]]; then
		log "changing role bridge on port $port: LOGIN SUPERUSER PASSWORD 'bridge'"
		pg_psql_port "$port" -d postgres -c "ALTER ROLE bridge LOGIN SUPERUSER PASSWORD 'bridge'"
	fi
	if [[ -z $(pg_psql_port "$port" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'bridge'") ]]; then
		log "creating database bridge on port $port"
		pg_psql_port "$port" -d postgres -c 'CREATE DATABASE bridge OWNER bridge'
	fi
}

start_postgres() {
	local t0=$SECONDS ver installed=no
	if ! command -v pg_ctlcluster >/dev/null || [[ -z $(pg_version) ]]; then
		apt_install postgresql
		installed=yes
	fi
	ver="$(pg_version)"
	[[ -n $ver ]] || die "no PostgreSQL server binaries found after installing postgresql"

	local port=$PG_PORT on cver cname cstatus
	on="$(pg_cluster_on "$PG_PORT")"
	read -r cver cname cstatus <<<"$on"
	if [[ -z $on ]] && ! port_open "$PG_PORT"; then
		# Nothing there: a cluster of our own on PG_PORT.
		pg_own_cluster "$ver" "$PG_CLUSTER" "$PG_PORT"
	elif [[ -n $on && ( -f /etc/postgresql/$cver/$cname/conf.d/$PG_MARKER || $installed == yes ) ]]; then
		# Ours: created by this script, or by the package this run installed
		# (Debian's postinst creates <ver>/main on 5432).
		pg_own_cluster "$cver" "$cname" "$PG_PORT"
	else
		# Someone else's server (a Debian cluster we did not create, or
		# whatever listens on the port).
		local what="PostgreSQL on 127.0.0.1:$PG_PORT"
		[[ -n $on ]] && what="PostgreSQL $cver/$cname on 127.0.0.1:$PG_PORT"
		if [[ -n $on && $cstatus != online* ]]; then
			log "$what was not created by this script and is not running: leaving it alone"
			port=$PG_DEDICATED_PORT
		else
			local needs
			needs="$(pg_needs "$PG_PORT")"
			if [[ -z $needs ]]; then
				log "$what was not created by this script; role bridge logs in, is superuser and max_connections >= $PG_MAX_CONNECTIONS: using it unchanged"
			elif [[ $PG_ADOPT == yes && -n $on ]]; then
				log "$what was not created by this script; PG_ADOPT=yes: changing it as follows:"
				printf '  - %s\n' "${needs//$'\n'/$'\n'  - }" >&2
				if grep -q max_connections <<<"$needs"; then
					pg_psql_port "$PG_PORT" -c "ALTER SYSTEM SET max_connections = $PG_MAX_CONNECTIONS"
					closed as_root pg_ctlcluster "$cver" "$cname" restart
					pg_wait "$PG_PORT" "/var/log/postgresql/postgresql-$cver-$cname.log"
				fi
				pg_setup_role "$PG_PORT"
			else
				log "$what was not created by this script. To use it, it would need:"
				printf '  - %s\n' "${needs//$'\n'/$'\n'  - }" >&2
				log "not changing it. Using a PostgreSQL cluster of its own on port $PG_DEDICATED_PORT instead" \
					"(PG_ADOPT=yes would apply the changes above to $what instead)."
				port=$PG_DEDICATED_PORT
			fi
		fi
		if [[ $port != "$PG_PORT" ]]; then
			local don dver dname
			don="$(pg_cluster_on "$port")"
			read -r dver dname _ <<<"$don"
			if [[ -n $don && ! -f /etc/postgresql/$dver/$dname/conf.d/$PG_MARKER ]] || { [[ -z $don ]] && port_open "$port"; }; then
				die "port $port (PG_DEDICATED_PORT) is taken by a server this script did not create either; set PG_DEDICATED_PORT to a free port"
			fi
			pg_own_cluster "${dver:-$ver}" "${dname:-$PG_CLUSTER}" "$port"
		fi
	fi

	DATABASE_URL="$(pg_url "$port")"
	PGPASSWORD=bridge psql -X -q "$DATABASE_URL" -tAc 'SELECT 1' >/dev/null ||
		die "cannot connect as bridge to $DATABASE_URL"
	echo "$DATABASE_URL" >"$STATE/database_url.tmp"
	mv "$STATE/database_url.tmp" "$STATE/database_url"
	log "PostgreSQL ready on 127.0.0.1:$port ($(elapsed "$t0"))"
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

# write_kafka_config DIR NODE_ID BROKER_PORT CONTROLLER_PORT VOTERS RF MIN_ISR
write_kafka_config() {
	local dir=$1 id=$2 port=$3 cport=$4 voters=$5 rf=$6 isr=$7
	mkdir -p "$dir/data" "$dir/logs"
	cat >"$dir/server.properties.tmp" <<-EOF
		# Generated by scripts/services-up.sh: KRaft node $id (broker+controller).
		process.roles=broker,controller
		node.id=$id
		controller.quorum.voters=$voters
		listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
		advertised.listeners=PLAINTEXT://127.0.0.1:$port
		controller.listener.names=CONTROLLER
		listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
		inter.broker.listener.name=PLAINTEXT
		log.dirs=$dir/data
		num.partitions=3
		default.replication.factor=$rf
		min.insync.replicas=$isr
		unclean.leader.election.enable=false
		offsets.topic.replication.factor=$rf
		offsets.topic.num.partitions=10
		share.coordinator.state.topic.replication.factor=$rf
		share.coordinator.state.topic.min.isr=$isr
		transaction.state.log.replication.factor=$rf
		transaction.state.log.min.isr=$isr
		transaction.state.log.num.partitions=10
		group.initial.rebalance.delay.ms=0
		auto.create.topics.enable=true
		delete.topic.enable=true
		num.network.threads=3
		num.io.threads=4
		log.retention.hours=24
		log.segment.bytes=104857600
	EOF
	mv "$dir/server.properties.tmp" "$dir/server.properties"
}

kafka_log_tail() {
	local dir=$1
	{
		echo "---- last lines of $dir/logs/server.log ----"
		tail -n 40 "$dir/logs/server.log" 2>/dev/null || true
		echo "---- last lines of $dir/logs/kafka.out ----"
		tail -n 20 "$dir/logs/kafka.out" 2>/dev/null || true
	} >&2
}

# kafka_format DIR CLUSTER_ID: formats DIR's storage once.
kafka_format() {
	local dir=$1 id=$2
	[[ -f $dir/data/meta.properties ]] && return 0
	log "formatting Kafka storage in $dir/data (cluster id $id)"
	kafka_java kafka.tools.StorageTool format -t "$id" \
		-c "$dir/server.properties" >"$dir/logs/format.out" 2>&1 || {
		cat "$dir/logs/format.out" >&2
		die "formatting Kafka storage failed ($dir)"
	}
}

# kafka_launch DIR HEAP: starts the node configured in DIR; sets DAEMON_PID
# and writes DIR/kafka.pid.
kafka_launch() {
	local dir=$1 heap=$2
	: >"$dir/logs/kafka.out"
	cd "$dir"
	daemon "$dir/logs/kafka.out" java -Xms128m "-Xmx$heap" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
		-Djava.awt.headless=true \
		-Dkafka.logs.dir="$dir/logs" \
		-Dlog4j2.configurationFile="$ROOT/scripts/kafka/log4j2.properties" \
		-cp "$KAFKA_HOME/libs/*" \
		kafka.Kafka "$dir/server.properties"
	echo "$DAEMON_PID" >"$dir/kafka.pid"
	cd "$ROOT"
}

# kafka_wait_port DIR PID PORT DEADLINE
kafka_wait_port() {
	local dir=$1 pid=$2 port=$3 deadline=$4
	while ! port_open "$port"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			kafka_log_tail "$dir"
			die "Kafka exited during startup ($dir)"
		fi
		if ((SECONDS >= deadline)); then
			kafka_log_tail "$dir"
			die "Kafka did not open 127.0.0.1:$port within ${KAFKA_READY_TIMEOUT}s"
		fi
		sleep 0.5
	done
}

# kafka_wait_listing BOOTSTRAP DIR PID DEADLINE: ready = the broker serves a
# metadata request (TopicCommand --list goes through the admin client).
kafka_wait_listing() {
	local bootstrap=$1 dir=$2 pid=$3 deadline=$4
	until kafka_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" \
		--list >/dev/null 2>"$dir/logs/ready-check.err"; do
		if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
			kafka_log_tail "$dir"
			die "Kafka exited during startup ($dir)"
		fi
		if ((SECONDS >= deadline)); then
			cat "$dir/logs/ready-check.err" >&2 || true
			kafka_log_tail "$dir"
			die "Kafka did not answer a topic listing on $bootstrap within ${KAFKA_READY_TIMEOUT}s"
		fi
		sleep 1
	done
}

start_kafka() {
	local t0=$SECONDS
	if port_open "$KAFKA_PORT"; then
		log "Kafka: 127.0.0.1:$KAFKA_PORT already answers, leaving it alone"
		return 0
	fi
	ensure_java
	kafka_libs
	write_kafka_config "$KAFKA_STATE" 1 "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" \
		"1@127.0.0.1:$KAFKA_CONTROLLER_PORT" 1 1
	kafka_format "$KAFKA_STATE" "$KAFKA_CLUSTER_ID"

	log "starting Kafka $KAFKA_VERSION (log: $KAFKA_STATE/logs/server.log)"
	kafka_launch "$KAFKA_STATE" 512m
	local pid=$DAEMON_PID deadline=$((SECONDS + KAFKA_READY_TIMEOUT))
	kafka_wait_port "$KAFKA_STATE" "$pid" "$KAFKA_PORT" "$deadline"
	kafka_wait_listing "127.0.0.1:$KAFKA_PORT" "$KAFKA_STATE" "$pid" "$deadline"
	log "Kafka $KAFKA_VERSION ready on 127.0.0.1:$KAFKA_PORT, pid $pid ($(elapsed "$t0"))"
}

# The three-node cluster: node i (1..3) has broker port P_i from
# KAFKA_CLUSTER_PORTS and controller port P_i+100; its data, log and pid file
# are in $KAFKA_CLUSTER_STATE/node-i.
start_kafka_cluster() {
	local t0=$SECONDS ports voters="" i=0 p
	read -r -a ports <<<"$KAFKA_CLUSTER_PORTS"
	((${#ports[@]} == 3)) || die "KAFKA_CLUSTER_PORTS must list three ports, got '$KAFKA_CLUSTER_PORTS'"
	for p in "${ports[@]}"; do
		i=$((i + 1))
		voters+="${voters:+,}$i@127.0.0.1:$((p + 100))"
	done
	local missing=()
	i=0
	for p in "${ports[@]}"; do
		i=$((i + 1))
		port_open "$p" || missing+=("$i")
	done
	if ((${#missing[@]} == 0)); then
		log "Kafka cluster: 127.0.0.1:${ports[0]},${ports[1]},${ports[2]} already answer, leaving it alone"
		return 0
	fi
	ensure_java
	kafka_libs
	local n dir pids=()
	for n in "${missing[@]}"; do
		dir="$KAFKA_CLUSTER_STATE/node-$n"
		write_kafka_config "$dir" "$n" "${ports[n - 1]}" "$((ports[n - 1] + 100))" "$voters" 3 2
		kafka_format "$dir" "$KAFKA_CLUSTER3_ID"
	done
	for n in "${missing[@]}"; do
		dir="$KAFKA_CLUSTER_STATE/node-$n"
		log "starting Kafka cluster node $n on 127.0.0.1:${ports[n - 1]} (log: $dir/logs/server.log)"
		kafka_launch "$dir" 384m
		pids+=("$DAEMON_PID")
	done
	local deadline=$((SECONDS + KAFKA_READY_TIMEOUT)) k=0
	for n in "${missing[@]}"; do
		kafka_wait_port "$KAFKA_CLUSTER_STATE/node-$n" "${pids[k]}" "${ports[n - 1]}" "$deadline"
		k=$((k + 1))
	done
	# A quorum needs two of the three controllers: list through the first
	# node that was started now.
	n="${missing[0]}"
	kafka_wait_listing "127.0.0.1:${ports[n - 1]}" "$KAFKA_CLUSTER_STATE/node-$n" "${pids[0]}" "$deadline"
	log "Kafka cluster node(s) ${missing[*]} ready, pid(s) ${pids[*]} ($(elapsed "$t0"))"
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
	: >"$JAEGER_STATE/jaeger.log"
	daemon "$JAEGER_STATE/jaeger.log" "$bin"
	local pid=$DAEMON_PID
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
# Schema registry (SERVICES=schema-registry; not in the default set)
# ---------------------------------------------------------------------------
# Apicurio Registry 2.4.2.Final, a Confluent-compatible registry (its API at
# /apis/ccompat/v7), storage H2 in memory, on 127.0.0.1:$SCHEMA_REGISTRY_PORT.
# Maven Central has no runnable build of it, so the first start runs the
# Quarkus build in scripts/schema-registry (about 3.5 minutes with an empty
# Maven repository, then cached under $SCHEMA_REGISTRY_HOME keyed by the
# build files' content). Start-up is ~10 s idle, 25 s on a loaded machine:
# the tests that need it start it (internal/schema's test helper runs this
# script with SERVICES=schema-registry), so runs that do not pay nothing.

SCHEMA_REGISTRY_VERSION=2.4.2.Final
SCHEMA_REGISTRY_PORT="${SCHEMA_REGISTRY_PORT:-8081}"
SCHEMA_REGISTRY_HOME="$CACHE/schema-registry-$SCHEMA_REGISTRY_VERSION"
SCHEMA_REGISTRY_STATE="$STATE/schema-registry"
SCHEMA_REGISTRY_READY_TIMEOUT="${SCHEMA_REGISTRY_READY_TIMEOUT:-180}"

schema_registry_url() { echo "http://127.0.0.1:$SCHEMA_REGISTRY_PORT/apis/ccompat/v7"; }

schema_registry_ready() {
	curl -sf -o /dev/null --max-time 2 "$(schema_registry_url)/subjects"
}

schema_registry_build() {
	local dir="$ROOT/scripts/schema-registry" sum stamp="$SCHEMA_REGISTRY_HOME/app/.build.sha256"
	sum="$(cd "$dir" && find . -type f ! -path '*/target/*' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"
	if [[ -f $stamp && $(cat "$stamp") == "$sum" ]]; then
		return 0
	fi
	command -v mvn >/dev/null || apt_install maven
	local t0=$SECONDS work="$SCHEMA_REGISTRY_HOME/build" logf="$STATE/schema-registry-mvn.log"
	log "building Apicurio Registry $SCHEMA_REGISTRY_VERSION with Maven (Quarkus build; log: $logf)"
	rm -rf "$work"
	mkdir -p "$work"
	cp -r "$dir/." "$work/"
	: >"$logf"
	local mvn=(mvn -B -ntp -Dstyle.color=never -s "$work/maven-settings.xml" -DskipTests)
	if ! "${mvn[@]}" -f "$work/config-index-deployment/pom.xml" install >>"$logf" 2>&1 ||
		! "${mvn[@]}" -f "$work/pom.xml" package >>"$logf" 2>&1; then
		tail -n 40 "$logf" >&2
		die "the schema registry build failed (scripts/schema-registry); full log: $logf"
	fi
	[[ -f $work/target/schema-registry-runtime-1-runner.jar ]] || die "the schema registry build made no runner jar (see $logf)"
	rm -rf "$SCHEMA_REGISTRY_HOME/app"
	mkdir -p "$SCHEMA_REGISTRY_HOME/app"
	mv "$work/target/schema-registry-runtime-1-runner.jar" "$work/target/lib" "$SCHEMA_REGISTRY_HOME/app/"
	echo "$sum" >"$stamp"
	rm -rf "$work"
	log "schema registry built ($(elapsed "$t0"))"
}

start_schema_registry() {
	local t0=$SECONDS
	command -v curl >/dev/null || apt_install curl ca-certificates
	if schema_registry_ready; then
		log "schema registry: $(schema_registry_url) already answers, leaving it alone"
		return 0
	fi
	port_open "$SCHEMA_REGISTRY_PORT" && die "port $SCHEMA_REGISTRY_PORT is taken, but no schema registry answers there"
	ensure_java
	schema_registry_build
	mkdir -p "$SCHEMA_REGISTRY_STATE"
	log "starting Apicurio Registry $SCHEMA_REGISTRY_VERSION (log: $SCHEMA_REGISTRY_STATE/registry.log)"
	: >"$SCHEMA_REGISTRY_STATE/registry.log"
	# Quarkus's own bind check misreports a port as "in use" when it cannot
	# bind the wildcard address here: bind loopback only.
	daemon "$SCHEMA_REGISTRY_STATE/registry.log" env HTTP_PORT="$SCHEMA_REGISTRY_PORT" \
		java -Xms64m -Xmx384m -XX:+UseSerialGC -Dquarkus.http.host=127.0.0.1 \
		-jar "$SCHEMA_REGISTRY_HOME/app/schema-registry-runtime-1-runner.jar"
	local pid=$DAEMON_PID deadline=$((SECONDS + SCHEMA_REGISTRY_READY_TIMEOUT))
	echo "$pid" >"$SCHEMA_REGISTRY_STATE/registry.pid"
	until schema_registry_ready; do
		if ! kill -0 "$pid" 2>/dev/null || ((SECONDS >= deadline)); then
			echo "---- last lines of $SCHEMA_REGISTRY_STATE/registry.log ----" >&2
			tail -n 30 "$SCHEMA_REGISTRY_STATE/registry.log" >&2 || true
			die "the schema registry did not answer $(schema_registry_url)/subjects within ${SCHEMA_REGISTRY_READY_TIMEOUT}s"
		fi
		sleep 0.5
	done
	log "schema registry ready at $(schema_registry_url), pid $pid ($(elapsed "$t0"))"
}
# ---------------------------------------------------------------------------

for s in $SERVICES; do
	case $s in
	postgres | kafka | jaeger | kafka-cluster | schema-registry) ;;
	*) die "unknown service '$s' in SERVICES (known: postgres kafka jaeger kafka-cluster schema-registry)" ;;
	esac
done
mkdir -p "$CACHE" "$STATE"

# One run at a time: two runs starting the same PostgreSQL cluster or Kafka
# data dir at once fail ("postmaster.pid already exists", a locked log dir).
# The lock is in the cache (shared by every state dir) because the Kafka jars
# are resolved there. Its descriptor is closed in every daemon (close_fds).
exec {LOCK_FD}>"$CACHE/services-up.lock"
if ! flock -n "$LOCK_FD"; then
	log "another services-up.sh is running; waiting for it (up to 15 min)"
	flock -w 900 "$LOCK_FD" || die "timed out waiting for $CACHE/services-up.lock"
fi

want postgres && start_postgres
want kafka && start_kafka
want kafka-cluster && start_kafka_cluster
want jaeger && start_jaeger
want schema-registry && start_schema_registry

echo
echo "Services:"
want postgres && echo "  postgres       ${DATABASE_URL#*@} (role/db bridge, password bridge)"
want kafka && echo "  kafka          127.0.0.1:$KAFKA_PORT (KRaft controller 127.0.0.1:$KAFKA_CONTROLLER_PORT), Kafka $KAFKA_VERSION, log $KAFKA_STATE/logs/server.log"
want kafka-cluster && echo "  kafka-cluster  127.0.0.1:${KAFKA_CLUSTER_PORTS// /,127.0.0.1:} (RF 3, min.insync.replicas 2), logs $KAFKA_CLUSTER_STATE/node-*/logs/server.log"
want schema-registry && echo "  schema-registry $(schema_registry_url) (Apicurio Registry $SCHEMA_REGISTRY_VERSION, in memory), log $SCHEMA_REGISTRY_STATE/registry.log"
want jaeger && echo "  jaeger         OTLP gRPC 127.0.0.1:4317, OTLP HTTP 127.0.0.1:4318, UI/query http://127.0.0.1:16686, log $JAEGER_STATE/jaeger.log"
echo
echo "Environment:"
want postgres && echo "  export DATABASE_URL='$DATABASE_URL'"
want kafka && echo "  export KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT"
want kafka-cluster && echo "  export KAFKA_CLUSTER_BROKERS=127.0.0.1:${KAFKA_CLUSTER_PORTS// /,127.0.0.1:}"
want schema-registry && echo "  export SCHEMA_REGISTRY_URL=$(schema_registry_url)"
if want jaeger; then
	echo "  export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318"
	echo "  export JAEGER_QUERY_URL=http://127.0.0.1:16686"
	echo "  export BRIDGE_TEST_JAEGER_OTLP=127.0.0.1:4318 BRIDGE_TEST_JAEGER_QUERY=http://127.0.0.1:16686"
fi
