#!/usr/bin/env bash
# The project's Prometheus: Debian's prometheus package (the server and promtool).
#
#   scripts/prometheus.sh install  apt-get install prometheus if prometheus or promtool is missing
#   scripts/prometheus.sh check    promtool: check the config and the rules, run the rules' unit tests
#   scripts/prometheus.sh up       start a server on 127.0.0.1:$GEM_PROMETHEUS_PORT (default 19090)
#                                  with $GEM_PROMETHEUS_CONFIG (default deploy/prometheus/prometheus.yml),
#                                  wait until /-/ready answers
#   scripts/prometheus.sh down     stop the server `up` started (SIGTERM, then SIGKILL)
#   scripts/prometheus.sh status   exit 0 when the server answers /-/ready, 3 when it is down
#
# Its pid file, log and TSDB live under $PROMETHEUS_STATE (default .cache/prometheus,
# git-ignored); a test runs its own server by setting PROMETHEUS_STATE, GEM_PROMETHEUS_PORT and
# GEM_PROMETHEUS_CONFIG. The server listens on 127.0.0.1 only; the web UI and the HTTP API
# (/api/v1/query, /api/v1/alerts) are on http://127.0.0.1:$GEM_PROMETHEUS_PORT. Debian's
# systemd unit is not used: `up` is idempotent and safe to run concurrently (flock).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEPLOY="$ROOT/deploy/prometheus"
STATE="${PROMETHEUS_STATE:-$ROOT/.cache/prometheus}"
PORT="${GEM_PROMETHEUS_PORT:-19090}"
CONFIG="${GEM_PROMETHEUS_CONFIG:-$DEPLOY/prometheus.yml}"
RETENTION="${GEM_PROMETHEUS_RETENTION:-7d}"
WAIT_S="${PROMETHEUS_WAIT_S:-60}"
PIDFILE="$STATE/prometheus.pid"
LOG="$STATE/prometheus.log"
URL="http://127.0.0.1:$PORT"

log() { echo "prometheus: $*" >&2; }

# shellcheck source=scripts/service-lib.sh
source "$ROOT/scripts/service-lib.sh"

our_pid() { pid_from "$PIDFILE" "prometheus"; }
ready() { curl -fsS -m 3 "$URL/-/ready" >/dev/null 2>&1; }

install() {
    command -v prometheus >/dev/null && command -v promtool >/dev/null && return 0
    apt_install "$STATE/apt.log" prometheus
    log "installed $(prometheus --version 2>&1 | head -n 1)"
}

check() {
    install
    promtool check config "$CONFIG"
    promtool check rules "$DEPLOY"/rules/*.yml
    promtool test rules "$DEPLOY"/tests/*.yml
}

start() {
    local pid
    if pid="$(our_pid)" && ready; then
        log "already up (pid $pid) on $URL"
        return 0
    fi
    if [[ -z "${pid:-}" ]] && port_open "$PORT"; then
        log "127.0.0.1:$PORT is taken by a process this script did not start;" \
            "stop it or choose another port with GEM_PROMETHEUS_PORT=..."
        exit 1
    fi
    install
    if [[ -z "${pid:-}" ]]; then
        promtool check config "$CONFIG" >"$STATE/check.log" 2>&1 || {
            log "$CONFIG does not pass promtool check config:"
            cat "$STATE/check.log" >&2
            exit 1
        }
        mkdir -p "$STATE/data"
        log "starting prometheus on $URL with $CONFIG (log: $LOG)"
        pid="$(spawn "$PIDFILE" "$LOG" prometheus --config.file="$CONFIG" --storage.tsdb.path="$STATE/data" \
            --storage.tsdb.retention.time="$RETENTION" --web.listen-address="127.0.0.1:$PORT")"
    fi
    await "prometheus" "$pid" "$PIDFILE" "$LOG" ready
    log "up (pid $pid) on $URL"
}

status() {
    if ready; then
        echo "prometheus: up (pid $(our_pid || echo '?')) on $URL; state $STATE"
        return 0
    fi
    echo "prometheus: down (start it with: make prometheus-up)"
    return 3
}

mkdir -p "$STATE"
lock() { state_lock 300; }

case "${1:-}" in
    install)
        lock
        install
        ;;
    check) check ;;
    up)
        lock
        start
        ;;
    down)
        lock
        stop_ours "$PIDFILE"
        ;;
    status) status ;;
    *)
        echo "usage: $0 install|check|up|down|status" >&2
        exit 2
        ;;
esac
