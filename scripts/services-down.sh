#!/usr/bin/env bash
# Stops what scripts/services-up.sh started: Kafka, the three-node Kafka
# cluster, the schema registry and Jaeger (by their pid files: SIGTERM, wait, SIGKILL as a last
# resort) and the PostgreSQL clusters the script created (those with its
# conf.d/outbox-bridge.conf marker; pg_ctlcluster stop). A server it did not
# create is left running.
#
#   --keep-postgres   leave PostgreSQL running
#
# SERVICES="kafka jaeger" selects a subset (default: all three). Data is kept:
# Kafka's log dir stays in the state dir, so the next start reuses it.
set -euo pipefail

CACHE="${OUTBOX_BRIDGE_CACHE:-$HOME/.cache/outbox-bridge}"
STATE="${OUTBOX_BRIDGE_STATE:-$CACHE/state}"
SERVICES="${SERVICES:-postgres kafka kafka-cluster jaeger schema-registry}"

for arg in "$@"; do
	case $arg in
	--keep-postgres) SERVICES="${SERVICES//postgres/}" ;;
	-h | --help)
		sed -n '2,10p' "$0"
		exit 0
		;;
	*)
		echo "usage: $0 [--keep-postgres]" >&2
		exit 2
		;;
	esac
done

log() { printf '[services-down] %s\n' "$*" >&2; }
want() { [[ " $SERVICES " == *" $1 "* ]]; }

# stop_pidfile NAME PIDFILE MATCH TIMEOUT: stops the process in PIDFILE if it
# is still the one we started (its command line contains MATCH).
stop_pidfile() {
	local name=$1 pidfile=$2 match=$3 timeout=$4 pid
	if [[ ! -f $pidfile ]]; then
		log "$name: no pid file ($pidfile), nothing to stop"
		return 0
	fi
	pid="$(cat "$pidfile")"
	if ! kill -0 "$pid" 2>/dev/null || ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$match"; then
		log "$name: pid $pid is not running (stale pid file)"
		rm -f "$pidfile"
		return 0
	fi
	log "$name: stopping pid $pid"
	kill -TERM "$pid"
	local deadline=$((SECONDS + timeout))
	while kill -0 "$pid" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			log "$name: still running after ${timeout}s, sending SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
			sleep 1
			break
		fi
		sleep 0.5
	done
	rm -f "$pidfile"
	log "$name: stopped"
}

if want kafka; then
	# Controlled shutdown of a single KRaft node takes a few seconds.
	stop_pidfile kafka "$STATE/kafka/kafka.pid" kafka.Kafka 60
fi
if want kafka-cluster; then
	for n in 1 2 3; do
		stop_pidfile "kafka-cluster node $n" "$STATE/kafka-cluster/node-$n/kafka.pid" kafka.Kafka 60
	done
fi
if want schema-registry; then
	stop_pidfile schema-registry "$STATE/schema-registry/registry.pid" schema-registry-runtime 30
fi
if want jaeger; then
	stop_pidfile jaeger "$STATE/jaeger/jaeger.pid" jaeger 30
fi
if want postgres; then
	if command -v pg_lsclusters >/dev/null; then
		# Stop the online cluster(s) this script created.
		pg_lsclusters -h | awk '$4 ~ /^online/ {print $1, $2}' |
			while read -r ver cluster; do
				if [[ ! -f /etc/postgresql/$ver/$cluster/conf.d/outbox-bridge.conf ]]; then
					log "postgres: $ver/$cluster was not created by services-up.sh, leaving it running"
					continue
				fi
				log "postgres: stopping cluster $ver/$cluster"
				if [[ $(id -u) -eq 0 ]]; then
					pg_ctlcluster "$ver" "$cluster" stop
				else
					sudo pg_ctlcluster "$ver" "$cluster" stop
				fi
			done
	else
		log "postgres: pg_lsclusters not found, nothing to stop"
	fi
fi
