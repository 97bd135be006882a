#!/usr/bin/env bash
# The project's Redis Cluster: the online store's scale-out backend (redis-cluster:// URIs).
#
#   scripts/redis-cluster.sh up       start 6 redis-server nodes, form 3 masters + 3 replicas, wait
#                                     until `cluster info` says cluster_state:ok with every slot covered
#   scripts/redis-cluster.sh down     stop the nodes started by `up` (by pid) and forget the cluster
#   scripts/redis-cluster.sh status   exit 0 when the cluster is ok, 3 when it is not
#   scripts/redis-cluster.sh install  install Debian's redis-server if missing
#
# Nodes listen on 127.0.0.1 ports $GEM_REDIS_CLUSTER_PORT .. +5 (default 17000-17005; each node's
# cluster bus is its port + 10000). State (pid files, logs, nodes-*.conf) lives under
# $REDIS_CLUSTER_STATE (default .cache/redis-cluster, git-ignored). No snapshots and no AOF, as
# for scripts/redis.sh: the store is rebuilt by precompute. `up` is idempotent: a node that was
# killed is restarted from its nodes-*.conf and rejoins (as a replica when its replica was
# promoted meanwhile). GEM_REDIS_CLUSTER_PASSWORD sets requirepass and masterauth on every node.
# Clients find it through GEM_REDIS_CLUSTER_URL=redis-cluster://127.0.0.1:17000.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STATE="${REDIS_CLUSTER_STATE:-$ROOT/.cache/redis-cluster}"
BASE="${GEM_REDIS_CLUSTER_PORT:-17000}"
MAXMEMORY="${GEM_REDIS_MAXMEMORY:-1gb}"
NODE_TIMEOUT_MS="${GEM_REDIS_CLUSTER_NODE_TIMEOUT_MS:-2000}"
PASSWORD="${GEM_REDIS_CLUSTER_PASSWORD:-}"
WAIT_S="${REDIS_WAIT_S:-60}"
PORTS=()
for i in 0 1 2 3 4 5; do PORTS+=($((BASE + i))); done

log() { echo "redis-cluster: $*" >&2; }

# shellcheck source=scripts/service-lib.sh
source "$ROOT/scripts/service-lib.sh"

# redis-cli with the password in its environment (never on a command line), when one is set
rcli() {
    if [[ -n "$PASSWORD" ]]; then REDISCLI_AUTH="$PASSWORD" redis-cli "$@"; else redis-cli "$@"; fi
}

cli() {
    local port="$1"
    shift
    rcli -h 127.0.0.1 -p "$port" "$@"
}

answers() { [[ "$(cli "$1" ping 2>/dev/null)" == PONG ]]; }

our_pid() { pid_from "$STATE/$1/redis.pid" "redis-server"; }

info_field() { cli "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"; }

healthy() {
    [[ "$(info_field "$BASE" cluster_state)" == ok && "$(info_field "$BASE" cluster_slots_ok)" == 16384 &&
        "$(info_field "$BASE" cluster_known_nodes)" == 6 ]] || return 1
    # every node (a restarted one included) sees the cluster ok; 3 masters, and 3 replicas whose
    # replication link is up (a replica that has not synced yet could not take over)
    local port role masters=0 replicas=0
    for port in "${PORTS[@]}"; do
        [[ "$(info_field "$port" cluster_state)" == ok ]] || return 1
        role="$(cli "$port" role 2>/dev/null | tr -d '\r' | tr '\n' ' ')"
        case "$role" in
            master*) masters=$((masters + 1)) ;;
            slave*connected*) replicas=$((replicas + 1)) ;;
        esac
    done
    ((masters == 3 && replicas == 3))
}

start_node() {
    local port="$1" dir="$STATE/$1" pid
    mkdir -p "$dir"
    if pid="$(our_pid "$port")" && answers "$port"; then
        return 0
    fi
    if [[ -z "${pid:-}" ]] && port_open "$port"; then
        log "127.0.0.1:$port is taken by a process this script did not start;" \
            "stop it or choose other ports with GEM_REDIS_CLUSTER_PORT=..."
        exit 1
    fi
    if [[ -z "${pid:-}" ]]; then
        local auth=()
        [[ -n "$PASSWORD" ]] && auth=(--requirepass "$PASSWORD" --masterauth "$PASSWORD")
        [[ -f "$dir/redis.log" ]] && mv -f "$dir/redis.log" "$dir/redis.log.1"
        log "starting node 127.0.0.1:$port (log: $dir/redis.log)"
        # 9>&-: the daemon must not inherit (and so hold) the lock taken below.
        redis-server --bind 127.0.0.1 --port "$port" --protected-mode yes --daemonize yes \
            --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --dir "$dir" \
            --cluster-enabled yes --cluster-config-file "nodes.conf" \
            --cluster-node-timeout "$NODE_TIMEOUT_MS" --cluster-require-full-coverage no \
            --save '' --appendonly no --maxmemory "$MAXMEMORY" --maxmemory-policy noeviction \
            "${auth[@]}" 9>&-
    fi
    local waited=0
    until answers "$port"; do
        if ((waited >= WAIT_S * 10)); then
            log "node $port: no PONG within ${WAIT_S}s; last lines of $dir/redis.log:"
            tail -n 20 "$dir/redis.log" >&2 || true
            exit 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

form() {
    # A fresh set of nodes (no slot assigned anywhere, each knowing only itself) is formed here;
    # nodes restarted from their nodes.conf find the cluster again by themselves.
    local port
    for port in "${PORTS[@]}"; do
        [[ "$(info_field "$port" cluster_slots_assigned)" == 0 && "$(info_field "$port" cluster_known_nodes)" == 1 ]] ||
            return 0
    done
    log "forming the cluster: 3 masters, 3 replicas"
    local hosts=()
    for port in "${PORTS[@]}"; do hosts+=("127.0.0.1:$port"); done
    rcli --cluster create "${hosts[@]}" --cluster-replicas 1 --cluster-yes \
        >"$STATE/create.log" 2>&1 || {
        log "redis-cli --cluster create failed; see $STATE/create.log"
        tail -n 20 "$STATE/create.log" >&2
        exit 1
    }
}

up() {
    bash "$ROOT/scripts/redis.sh" install
    local port
    for port in "${PORTS[@]}"; do start_node "$port"; done
    form
    local waited=0
    until healthy; do
        if ((waited >= WAIT_S * 5)); then
            log "cluster not ok within ${WAIT_S}s:"
            cli "$BASE" cluster info >&2 || true
            log "if it is wedged: make redis-cluster-down && make redis-cluster-up"
            exit 1
        fi
        sleep 0.2
        waited=$((waited + 1))
    done
    log "up: 6 nodes on 127.0.0.1:${PORTS[0]}-${PORTS[5]}, cluster_state:ok, 16384 slots covered"
}

down() {
    local port pid
    for port in "${PORTS[@]}"; do
        if pid="$(our_pid "$port")"; then
            log "stopping node $port (pid $pid)"
            cli "$port" shutdown nosave >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 100); do
                pid_alive "$pid" redis-server || break
                sleep 0.1
            done
            pid_alive "$pid" redis-server && kill -KILL "$pid" 2>/dev/null
        fi
        # the cluster's membership goes with it: the next `up` forms a fresh one
        rm -f "$STATE/$port/redis.pid" "$STATE/$port/nodes.conf"
    done
    log "down"
}

status() {
    if healthy; then
        echo "redis-cluster: ok on 127.0.0.1:${PORTS[0]}-${PORTS[5]}; state $STATE"
        return 0
    fi
    echo "redis-cluster: not ok (start it with: make redis-cluster-up)"
    return 3
}

mkdir -p "$STATE"
lock() { state_lock 120; }

case "${1:-}" in
    up)
        lock
        up
        ;;
    down)
        lock
        down
        ;;
    status) status ;;
    install) bash "$ROOT/scripts/redis.sh" install ;;
    *)
        echo "usage: $0 up|down|status|install" >&2
        exit 2
        ;;
esac
