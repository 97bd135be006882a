#!/usr/bin/env bash
# The project's Redis: the online representation store's real backend.
#
#   scripts/redis.sh up       install Debian's redis-server if missing, start it, wait for PING
#   scripts/redis.sh down     stop the server started by `up` (SHUTDOWN NOSAVE, then SIGTERM/SIGKILL)
#   scripts/redis.sh status   exit 0 when the server answers PING, 3 when it is down
#   scripts/redis.sh install  install Debian's redis-server if missing (scripts/redis-cluster.sh uses it)
#
# One redis-server on 127.0.0.1:$GEM_REDIS_PORT (default 16379); its pid file, log and
# data dir live under $REDIS_STATE (default .cache/redis, git-ignored). No snapshots and
# no AOF: the store is rebuilt by precompute; maxmemory with `noeviction`, so a full
# server fails writes loudly instead of dropping representations. `up` is idempotent
# and safe to run concurrently (flock). Clients find it through
# GEM_REDIS_URL=redis://127.0.0.1:16379/0.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STATE="${REDIS_STATE:-$ROOT/.cache/redis}"
PORT="${GEM_REDIS_PORT:-16379}"
MAXMEMORY="${GEM_REDIS_MAXMEMORY:-4gb}"
WAIT_S="${REDIS_WAIT_S:-20}"
PIDFILE="$STATE/redis.pid"
LOG="$STATE/redis.log"

log() { echo "redis: $*" >&2; }

answers() { command -v redis-cli >/dev/null && [[ "$(redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null)" == PONG ]]; }

# shellcheck source=scripts/service-lib.sh
source "$ROOT/scripts/service-lib.sh"

alive() { pid_alive "$1" "redis-server"; }

our_pid() { pid_from "$PIDFILE" "redis-server"; }  # the server started from this state dir, if alive

install() {
    command -v redis-server >/dev/null && command -v redis-cli >/dev/null && return 0
    apt_install "$STATE/apt.log" redis-server
    log "installed $(redis-server --version | cut -d' ' -f1-3)"
}

start() {
    if pid="$(our_pid)" && answers; then
        log "already up (pid $pid) on 127.0.0.1:$PORT"
        return 0
    fi
    if [[ -z "${pid:-}" ]] && port_open "$PORT"; then
        log "127.0.0.1:$PORT is taken by a process this script did not start;" \
            "stop it or choose another port with GEM_REDIS_PORT=..."
        exit 1
    fi
    install
    if [[ -z "${pid:-}" ]]; then
        [[ -f "$LOG" ]] && mv -f "$LOG" "$LOG.1"
        log "starting redis-server on 127.0.0.1:$PORT (log: $LOG)"
        # 9>&-: the daemon must not inherit (and so hold) the lock taken below.
        redis-server --bind 127.0.0.1 --port "$PORT" --protected-mode yes --daemonize yes \
            --pidfile "$PIDFILE" --logfile "$LOG" --dir "$STATE" \
            --save '' --appendonly no --maxmemory "$MAXMEMORY" --maxmemory-policy noeviction 9>&-
    fi
    local waited=0
    until answers; do
        if ((waited >= WAIT_S * 10)); then
            log "no PONG within ${WAIT_S}s; last lines of $LOG:"
            tail -n 20 "$LOG" >&2 || true
            exit 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    log "up (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"
}

down() {
    local pid
    if ! pid="$(our_pid)"; then
        log "not running"
        return 0
    fi
    log "stopping pid $pid"
    redis-cli -h 127.0.0.1 -p "$PORT" shutdown nosave >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
        alive "$pid" || break
        sleep 0.1
    done
    if alive "$pid"; then
        log "pid $pid still alive after 10 s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PIDFILE"
    log "down"
}

status() {
    if answers; then
        echo "redis: up (pid $(our_pid || echo '?')) on 127.0.0.1:$PORT; state $STATE"
        return 0
    fi
    echo "redis: down (start it with: make redis-up)"
    return 3
}

mkdir -p "$STATE"
lock() { state_lock 60; }

case "${1:-}" in
    up)
        lock
        start
        ;;
    down)
        lock
        down
        ;;
    status) status ;;
    install)
        lock
        install
        ;;
    *)
        echo "usage: $0 up|down|status|install" >&2
        exit 2
        ;;
esac
