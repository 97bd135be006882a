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
