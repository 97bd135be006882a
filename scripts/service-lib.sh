# Helpers shared by the service scripts (kafka.sh, redis.sh, flink.sh, spark.sh; sourced, not run).

# port_open PORT: something accepts connections on 127.0.0.1:PORT.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# pid_alive PID PATTERN: the process lives (not a zombie) and its command line holds PATTERN.
pid_alive() { kill -0 "$1" 2>/dev/null && grep -q "$2" "/proc/$1/cmdline" 2>/dev/null; }

# pid_from PIDFILE PATTERN: print the pid recorded in PIDFILE if that process is still ours;
# otherwise remove the stale PIDFILE and fail.
pid_from() {
    [[ -f "$1" ]] || return 1
    local pid
    pid="$(cat "$1")"
    if [[ -n "$pid" ]] && pid_alive "$pid" "$2"; then
        echo "$pid"
        return 0
    fi
    rm -f "$1"
    return 1
}

# stop_pid PID: SIGTERM, wait up to 30 s for the process to go, then SIGKILL (uses the caller's log).
stop_pid() {
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 60); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.5
    done
    log "pid $1 still alive after 30 s; sending SIGKILL"
    kill -KILL "$1" 2>/dev/null || true
}

# spawn PIDFILE LOG CMD...: start CMD in a session of its own (setsid: it outlives the make or CI
# shell that started it; fd 9, the caller's lock, is not inherited), output to LOG; print its pid.
spawn() {
    local pidfile="$1" logfile="$2"
    shift 2
    setsid nohup bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$pidfile" "$@" >"$logfile" 2>&1 </dev/null 9>&- &
    for _ in $(seq 50); do [[ -s "$pidfile" ]] && break; sleep 0.1; done
    cat "$pidfile"
}

# await WHAT PID PIDFILE LOG CHECK...: run CHECK every 0.5 s until it succeeds. If PID exits first,
# print LOG's last lines, forget PIDFILE and exit 1; after $WAIT_S seconds, exit 1 naming LOG.
await() {
    local what="$1" pid="$2" pidfile="$3" logfile="$4" waited=0
    shift 4
    until "$@"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "$what exited during start; last lines of $logfile:"
            tail -n 30 "$logfile" >&2
            rm -f "$pidfile"
            exit 1
        fi
        if ((waited >= WAIT_S * 2)); then
            log "$what did not answer within ${WAIT_S}s; see $logfile"
            exit 1
        fi
        sleep 0.5
        waited=$((waited + 1))
    done
}

# stop_ours PIDFILE: stop the process the caller's `our_pid` names (stop_pid) and forget PIDFILE.
stop_ours() {
    local pid
    if ! pid="$(our_pid)"; then
        log "not running"
        return 0
    fi
    log "stopping pid $pid"
    stop_pid "$pid"
    rm -f "$1"
    log "down"
}

# apt_install LOGFILE PACKAGE...: install Debian packages (apt-get update once if the first try
# fails), output to LOGFILE; as non-root, print the command to run instead and exit 1.
apt_install() {
    local logfile="$1"
    shift
    if [[ "$(id -u)" != 0 ]]; then
        log "not installed: $*; run: sudo apt-get install -y $*"
        exit 1
    fi
    log "installing Debian's $* ..."
    export DEBIAN_FRONTEND=noninteractive
    local apt=(apt-get install -y -qq --no-install-recommends "$@")
    "${apt[@]}" >"$logfile" 2>&1 || { apt-get update -qq >>"$logfile" 2>&1 && "${apt[@]}" >>"$logfile" 2>&1; } || {
        log "apt-get install $* failed; last lines of $logfile:"
        tail -n 20 "$logfile" >&2
        exit 1
    }
}

# Take "$STATE/.lock" on fd 9 for the calling script, waiting at most $1 seconds: one start, stop
# or install of a service at a time (the callers define log and STATE).
state_lock() {
    exec 9>"$STATE/.lock"
    flock -w "$1" 9 || { log "another scripts/$(basename "$0") has held $STATE/.lock for $1 s"; exit 1; }
}
