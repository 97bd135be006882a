#!/usr/bin/env bash
# The project's Kafka broker: Apache Kafka 4.x, KRaft, one node on 127.0.0.1.
#
#   scripts/kafka.sh up       resolve the jars (Maven, first run only), format storage, start, wait
#   scripts/kafka.sh down     stop the broker started by `up` (SIGTERM, then SIGKILL after 30 s)
#   scripts/kafka.sh status   exit 0 when the broker answers, 3 when it is down
#   scripts/kafka.sh libs     only resolve the jars into $KAFKA_STATE/libs
#
# Everything lives under $KAFKA_STATE (default .cache/kafka, git-ignored):
#   libs/  jars from Maven Central (deploy/kafka/pom.xml), data/  the log dirs,
#   logs/server.log, kafka.pid, cluster.id, server.properties (rendered).
# $KAFKA_LIBS (default $KAFKA_STATE/libs) may name another state's resolved libs/: the tests' private
# brokers (tests/fixtures/kafka.py) reuse .cache/kafka/libs with a data dir and ports of their own.
# `up` is idempotent: a running broker is left alone. Ports (127.0.0.1 only):
#   $KAFKA_PORT (default 19092) PLAINTEXT, +1 controller, +2 SASL_PLAINTEXT (PLAIN, user gem).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEPLOY="$ROOT/deploy/kafka"
STATE="${KAFKA_STATE:-$ROOT/.cache/kafka}"
PORT="${KAFKA_PORT:-19092}"
CONTROLLER_PORT=$((PORT + 1))
SASL_PORT=$((PORT + 2))
HEAP="${KAFKA_HEAP:--Xms256m -Xmx512m}"
WAIT_S="${KAFKA_WAIT_S:-120}"
LIBS="${KAFKA_LIBS:-$STATE/libs}"
PIDFILE="$STATE/kafka.pid"
LOG="$STATE/logs/server.log"
JAVA="${JAVA:-java}"

log() { echo "kafka: $*" >&2; }

# shellcheck source=scripts/service-lib.sh
source "$ROOT/scripts/service-lib.sh"

our_pid() { pid_from "$PIDFILE" "kafka.Kafka"; }  # the broker started from this state dir, if alive

resolve_libs() {
    local stamp="$LIBS/.resolved"
    if [[ -f "$stamp" && "$stamp" -nt "$DEPLOY/pom.xml" ]]; then
        return 0
    fi
    command -v mvn >/dev/null || { log "Maven (mvn) is needed to resolve the broker's jars"; exit 1; }
    log "resolving broker jars from Maven Central (deploy/kafka/pom.xml) ..."
    local tmp="$STATE/libs.tmp"
    rm -rf "$tmp"
    mkdir -p "$STATE"
    mvn -q -B -Dstyle.color=never -f "$DEPLOY/pom.xml" dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$tmp" >&2
    rm -rf "$LIBS"
    mv "$tmp" "$LIBS"
    touch "$LIBS/.resolved"
    log "$(find "$LIBS" -name '*.jar' | wc -l) jars in $LIBS"
}

render_config() {
    sed -e "s|@PORT@|$PORT|g" -e "s|@CONTROLLER_PORT@|$CONTROLLER_PORT|g" \
        -e "s|@SASL_PORT@|$SASL_PORT|g" -e "s|@STATE@|$STATE|g" \
        "$DEPLOY/server.properties.in" >"$STATE/server.properties"
}

kafka_java() {
    # shellcheck disable=SC2086
    "$JAVA" $HEAP -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$DEPLOY/log4j2.properties" \
        -cp "$LIBS/*" "$@"
}

format_storage() {
    if [[ -f "$STATE/data/meta.properties" ]]; then
        return 0
    fi
    if [[ ! -f "$STATE/cluster.id" ]]; then
        kafka_java kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1 >"$STATE/cluster.id"
    fi
    log "formatting storage in $STATE/data (cluster id $(cat "$STATE/cluster.id"))"
    kafka_java kafka.tools.StorageTool format -t "$(cat "$STATE/cluster.id")" \
        -c "$STATE/server.properties" --ignore-formatted >>"$STATE/logs/format.log" 2>&1 || {
        log "storage format failed; see $STATE/logs/format.log"
        tail -n 20 "$STATE/logs/format.log" >&2
        exit 1
    }
}

up() {
    if pid="$(our_pid)"; then
        if port_open "$PORT"; then
            log "already up (pid $pid) on 127.0.0.1:$PORT"
            return 0
        fi
        log "pid $pid is starting; waiting"
    else
        if port_open "$PORT"; then
            log "127.0.0.1:$PORT is taken by a process this script did not start;" \
                "stop it or choose another port with KAFKA_PORT=..."
            exit 1
        fi
        command -v "$JAVA" >/dev/null || { log "Java 17+ is needed to run the broker"; exit 1; }
        resolve_libs
        mkdir -p "$STATE/data" "$STATE/logs"
        render_config
        format_storage
        [[ -f "$LOG" ]] && mv -f "$LOG" "$LOG.1"
        log "starting broker on 127.0.0.1:$PORT (logs: $LOG)"
        # shellcheck disable=SC2086
        pid="$(spawn "$PIDFILE" "$LOG" \
            "$JAVA" $HEAP -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
            -Dlog4j2.configurationFile="$DEPLOY/log4j2.properties" \
            -Dkafka.logs.dir="$STATE/logs" -cp "$LIBS/*" \
            kafka.Kafka "$STATE/server.properties")"
    fi
    await broker "$pid" "$PIDFILE" "$LOG" started
    log "up (pid $pid) on 127.0.0.1:$PORT, SASL_PLAINTEXT on 127.0.0.1:$SASL_PORT"
}

down() { stop_ours "$PIDFILE"; }

# started: the broker accepts connections and has logged that it is ready.
started() { port_open "$PORT" && grep -q "Kafka Server started" "$LOG" 2>/dev/null; }

status() {
    if pid="$(our_pid)" && port_open "$PORT"; then
        echo "kafka: up (pid $pid) on 127.0.0.1:$PORT; state $STATE"
        return 0
    fi
    echo "kafka: down (start it with: make kafka-up)"
    return 3
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    libs) resolve_libs ;;
    *)
        echo "usage: $0 up|down|status|libs" >&2
        exit 2
        ;;
esac
