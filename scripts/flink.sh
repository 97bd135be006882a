#!/usr/bin/env bash
# The project's Flink: a local Flink 1.19.0 session cluster shaped like a production one.
#
#   scripts/flink.sh up         assemble the Flink home (first run only), start a JobManager,
#                               $FLINK_TASKMANAGERS TaskManagers (default 2), a Beam Python SDK
#                               worker pool (python -m pipelines.worker_pool, the venv's) and a
#                               standing Beam job server; wait until each answers; then, when it
#                               started any part, $FLINK_WARM_JOBS (2) small warm-up jobs (see warm)
#   scripts/flink.sh down       stop what `up` started, by pid (job server, pool, Flink)
#   scripts/flink.sh status     exit 0 when the cluster answers with its slots, 3 when it is down
#   scripts/flink.sh jobserver  build Beam's Flink job server jar once (Maven, deploy/flink/pom.xml)
#                               and print its path on stdout
#   scripts/flink.sh serve      (re)start only the standing job server (`up` does it too)
#
# The cluster advertises its job server and worker pool in its own configuration (keys
# gem.beam.job-endpoint and gem.beam.worker-pool of config.yaml, read back from the REST API's
# /jobmanager/config), so a plain `--runner FlinkRunner --flink_master 127.0.0.1:8081` submits
# through the standing job server (no job server JVM started per job) with its Python work
# in the pool's worker processes (--environment_type EXTERNAL): see pipelines/jobservers.py.
# On one host the pool starts a separate SDK worker process for each TaskManager's harness (each
# TaskManager asks it for its own worker); in Kubernetes each TaskManager pod has a pool sidecar
# on localhost (deploy/flink/flinkdeployment.yaml).
#
# The Flink home comes from two PyPI files, downloaded (pip download --no-deps), never
# installed: the apache-flink-libraries sdist (lib/, opt/, plugins/, bin/bash-java-utils.jar)
# and the apache-flink wheel (bin/*.sh, conf/). Everything lives under $FLINK_STATE
# (default .cache/flink, git-ignored): downloads/, flink-<v>/ (the home), conf/ (config.yaml
# rendered from deploy/flink/config.yaml.in), run/ (pid files), log/, tmp/, checkpoints/
# (RocksDB, incremental), savepoints/, artifacts/ (the job server's staged artifacts).
# `up` is idempotent (running parts are left alone; a lost TaskManager, pool or job server is
# restarted) and safe to run concurrently (flock). REST and web UI on
# http://127.0.0.1:$FLINK_REST_PORT (default 8081); job server on $FLINK_JOB_PORT (8099); worker
# pool on $FLINK_POOL_PORT (50000). Flink's own metrics: the Prometheus reporter of the
# distribution on ports $FLINK_PROM_PORTS (default 9250-9259).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEPLOY="$ROOT/deploy/flink"
# The runner's versions: deploy/versions.env (the one place; the environment may override).
versions_env() { sed -n "s/^$1=//p" "$ROOT/deploy/versions.env"; }
MINOR="${FLINK_MINOR:-$(versions_env FLINK_MINOR)}"
# The cluster: the Flink release the runner for $MINOR was built against.
VERSION="${FLINK_VERSION:-$MINOR.0}"
STATE="${FLINK_STATE:-$ROOT/.cache/flink}"
# The Flink home (the software) may be shared: a second cluster (the TaskManager-kill test)
# points GEM_FLINK_HOME at the assembled one and keeps its own $FLINK_STATE (config, pids,
# logs, checkpoints) and ports. Flink's scripts read the configuration from $FLINK_CONF_DIR.
FLINK_HOME="${GEM_FLINK_HOME:-$STATE/flink-$VERSION}"
export FLINK_CONF_DIR="$STATE/conf"
PORT="${FLINK_REST_PORT:-8081}"
RPC_PORT="${FLINK_RPC_PORT:-6123}"
SLOTS="${FLINK_SLOTS:-2}"  # per TaskManager
TASKMANAGERS="${FLINK_TASKMANAGERS:-2}"
JM_MEMORY="${FLINK_JM_MEMORY:-1024m}"
TM_MEMORY="${FLINK_TM_MEMORY:-2560m}"
WAIT_S="${FLINK_WAIT_S:-120}"
HEARTBEAT_INTERVAL="${FLINK_HEARTBEAT_INTERVAL_MS:-10000}"
HEARTBEAT_TIMEOUT="${FLINK_HEARTBEAT_TIMEOUT_MS:-50000}"
# Flink's Prometheus reporter: each process serves /metrics on the first free port of this range.
PROM_PORTS="${FLINK_PROM_PORTS:-9250-9259}"
BEAM_RUNNER_VERSION="${BEAM_FLINK_RUNNER_VERSION:-$(versions_env BEAM_FLINK_RUNNER_VERSION)}"
JOB_PORT="${FLINK_JOB_PORT:-8099}"
POOL_PORT="${FLINK_POOL_PORT:-50000}"
JARS="$ROOT/.cache/jars"
JOBSERVER_JAR="$JARS/beam-runners-flink-$MINOR-job-server-$BEAM_RUNNER_VERSION.jar"
DOWNLOADS="$STATE/downloads"
URL="http://127.0.0.1:$PORT"

# Flink's own scripts read these: pid files and logs under $STATE, names not tied to $USER.
export FLINK_IDENT_STRING=gem FLINK_PID_DIR="$STATE/run" FLINK_LOG_DIR="$STATE/log"
JM_PIDFILE="$FLINK_PID_DIR/flink-gem-standalonesession.pid"
TM_PIDFILE="$FLINK_PID_DIR/flink-gem-taskexecutor.pid"
JS_PIDFILE="$FLINK_PID_DIR/jobserver.pid"
JS_LOG="$FLINK_LOG_DIR/jobserver.log"
POOL_PIDFILE="$FLINK_PID_DIR/worker-pool.pid"
POOL_LOG="$FLINK_LOG_DIR/worker-pool.log"
VENV_PY="$ROOT/.venv/bin/python"

log() { echo "flink: $*" >&2; }

# shellcheck source=scripts/service-lib.sh
source "$ROOT/scripts/service-lib.sh"

python_for_pip() {
    if [[ -x "$ROOT/.venv/bin/python" ]]; then echo "$ROOT/.venv/bin/python"; else echo python3; fi
}

# live_pids PIDFILE PATTERN: the pids in Flink's pid file (one a line) still alive and ours.
live_pids() {
    [[ -f "$1" ]] || return 0
    local p
    while read -r p; do
        [[ -n "$p" ]] && pid_alive "$p" "$2" && echo "$p"
    done <"$1"
    return 0
}
js_pid() { pid_from "$JS_PIDFILE" "flink-.*-job-server"; }
jm_pids() { live_pids "$JM_PIDFILE" StandaloneSessionClusterEntrypoint; }
tm_pids() { live_pids "$TM_PIDFILE" TaskManagerRunner; }
pool_pid() { pid_from "$POOL_PIDFILE" "pipelines.worker_pool"; }

# overview: the REST API's /overview JSON, or fail.
overview() { curl -fsS -m 3 "$URL/overview" 2>/dev/null; }
json_int() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" <<<"$2"; }

# answers: the cluster has all $TASKMANAGERS TaskManagers and their slots registered.
answers() {
    local o
    o="$(overview)" || return 1
    (($(json_int taskmanagers "$o") >= TASKMANAGERS && $(json_int slots-total "$o") >= SLOTS * TASKMANAGERS))
}

download() {
    local sdist="$DOWNLOADS/apache-flink-libraries-$VERSION.tar.gz"
    if [[ -f "$sdist" ]] && compgen -G "$DOWNLOADS/apache_flink-$VERSION-*.whl" >/dev/null; then
        return 0
    fi
    local py
    py="$(python_for_pip)"
    log "downloading apache-flink-libraries $VERSION (230 MB sdist) and apache-flink $VERSION (wheel) from PyPI ..."
    mkdir -p "$DOWNLOADS"
    # Only downloads: pip prepares the sdist's metadata (build isolation) but installs nothing.
    "$py" -m pip download -q --no-deps --dest "$DOWNLOADS" "apache-flink-libraries==$VERSION" >&2
    "$py" -m pip download -q --no-deps --only-binary=:all: --dest "$DOWNLOADS" "apache-flink==$VERSION" >&2
}

# assemble: lay out one Flink home from the two files (once).
assemble() {
    [[ -f "$FLINK_HOME/.assembled" ]] && return 0
    download
    local tmp="$STATE/flink-$VERSION.tmp" sdist="$DOWNLOADS/apache-flink-libraries-$VERSION.tar.gz" wheel
    wheel="$(compgen -G "$DOWNLOADS/apache_flink-$VERSION-*.whl" | head -n 1)"
    log "assembling $FLINK_HOME from $(basename "$sdist") and $(basename "$wheel")"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    local top="apache-flink-libraries-$VERSION/deps"
    tar -xzf "$sdist" -C "$tmp" --strip-components=2 "$top/lib" "$top/opt" "$top/plugins" "$top/bin"
    "$(python_for_pip)" - "$wheel" "$tmp" <<'EOF'
import sys, zipfile
wheel, home = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        for part in ("bin", "conf"):
            prefix = f"pyflink/{part}/"
            if name.startswith(prefix) and not name.endswith("/"):
                target = f"{home}/{part}/{name[len(prefix):]}"
                import os
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with z.open(name) as src, open(target, "wb") as dst:
                    dst.write(src.read())
EOF
    chmod +x "$tmp"/bin/*.sh "$tmp/bin/flink"
    [[ -f "$tmp/lib/flink-dist-$VERSION.jar" && -x "$tmp/bin/jobmanager.sh" && -f "$tmp/bin/bash-java-utils.jar" ]] || {
        log "the downloaded files do not hold a Flink home (no flink-dist jar or bin/jobmanager.sh)"
        exit 1
    }
    mv "$tmp/conf/config.yaml" "$tmp/conf/config.yaml.dist"
    touch "$tmp/.assembled"
    rm -rf "$FLINK_HOME"
    mv "$tmp" "$FLINK_HOME"
}

# render_config: this cluster's conf/ under $STATE (the home's logging files, our config.yaml).
render_config() {
    mkdir -p "$STATE/run" "$STATE/log" "$STATE/tmp/web" "$STATE/checkpoints" "$STATE/savepoints" "$FLINK_CONF_DIR"
    local f
    for f in "$FLINK_HOME"/conf/*; do
        case "$(basename "$f")" in config.yaml* | masters | workers) ;; *) cp "$f" "$FLINK_CONF_DIR/" ;; esac
    done
    sed -e "s|@STATE@|$STATE|g" -e "s|@PORT@|$PORT|g" -e "s|@RPC_PORT@|$RPC_PORT|g" \
        -e "s|@SLOTS@|$SLOTS|g" -e "s|@JM_MEMORY@|$JM_MEMORY|g" -e "s|@TM_MEMORY@|$TM_MEMORY|g" \
        -e "s|@HEARTBEAT_INTERVAL@|$HEARTBEAT_INTERVAL|g" -e "s|@HEARTBEAT_TIMEOUT@|$HEARTBEAT_TIMEOUT|g" \
        -e "s|@PROM_PORTS@|$PROM_PORTS|g" -e "s|@JOB_PORT@|$JOB_PORT|g" -e "s|@POOL_PORT@|$POOL_PORT|g" \
        "$DEPLOY/config.yaml.in" >"$FLINK_CONF_DIR/config.yaml"
    echo "127.0.0.1:$PORT" >"$FLINK_CONF_DIR/masters"
    echo "127.0.0.1" >"$FLINK_CONF_DIR/workers"
}

# daemon jobmanager|taskmanager start|stop-all: Flink's own script, in a session of its own
# (setsid: the daemons outlive make/CI), without our lock on fd 9.
# Beam's runner classes (the job server jar) go on the daemons' own classpath, after flink-dist's
# (Flink's scripts append $HADOOP_CLASSPATH last; Flink's classes win), and config.yaml loads
# classes parent-first: the runner then keeps each TaskManager's SDK worker for the whole
# job (--environment_cache_millis), which it does only when its classes come from Flink's own
# classloader; from the job's jar it ends the worker after every stage. FLINK_BEAM_CLASSPATH=0
# leaves them out (each stage then starts its own SDK worker).
daemon() {
    local extra=""
    [[ "${FLINK_BEAM_CLASSPATH:-1}" == 0 ]] || extra="$JOBSERVER_JAR"
    HADOOP_CLASSPATH="${HADOOP_CLASSPATH:-}${extra:+:$extra}" \
        setsid -w "$FLINK_HOME/bin/$1.sh" "$2" 9>&- </dev/null 2>&1 | sed 's/^/flink: /' >&2
}

# start_flink: the JobManager and the missing TaskManagers; wait until all slots are registered.
start_flink() {
    local jm live
    jm="$(jm_pids | head -n 1)"
    if [[ -z "$jm" ]] && port_open "$PORT"; then
        log "127.0.0.1:$PORT is taken by a process this script did not start;" \
            "stop it or choose another port with FLINK_REST_PORT=..."
        exit 1
    fi
    command -v java >/dev/null || { log "Java 11+ is needed to run Flink"; exit 1; }
    assemble
    render_config
    if [[ -z "$jm" ]]; then
        rm -f "$JM_PIDFILE"
        log "starting the JobManager (REST on $URL, logs in $STATE/log)"
        daemon jobmanager start
    fi
    live="$(tm_pids | wc -l)"
    if ((live == 0)); then rm -f "$TM_PIDFILE"; fi
    while ((live < TASKMANAGERS)); do
        log "starting TaskManager $((live + 1)) of $TASKMANAGERS ($SLOTS slots, $TM_MEMORY)"
        daemon taskmanager start
        live=$((live + 1))
    done
    local waited=0
    until answers; do
        if [[ -z "$(jm_pids)" || "$(tm_pids | wc -l)" -lt "$TASKMANAGERS" ]]; then
            log "a Flink process exited during start; last lines of its log:"
            tail -n 30 "$(ls -t "$STATE"/log/*.log | head -n 1)" >&2 || true
            exit 1
        fi
        if ((waited >= WAIT_S * 2)); then
            log "no $TASKMANAGERS TaskManagers with $SLOTS slots each on $URL/overview within ${WAIT_S}s; see $STATE/log"
            exit 1
        fi
        sleep 0.5
        waited=$((waited + 1))
    done
}

# start_pool: Beam's SDK worker pool from the project's venv (pipelines/worker_pool.py: Beam's
# worker_pool_main, safe for TaskManagers that share it); 'python' on its PATH is the venv's, which
# the pool runs for each worker; PYTHONPATH makes the workers import this checkout.
start_pool() {
    local pid
    if pid="$(pool_pid)"; then
        await "worker pool" "$pid" "$POOL_PIDFILE" "$POOL_LOG" port_open "$POOL_PORT"
        return 0
    fi
    [[ -x "$VENV_PY" ]] || { log "no $VENV_PY: run make setup"; exit 1; }
    if port_open "$POOL_PORT"; then
        log "127.0.0.1:$POOL_PORT is taken by a process this script did not start;" \
            "stop it or choose another port with FLINK_POOL_PORT=..."
        exit 1
    fi
    log "starting the SDK worker pool on 127.0.0.1:$POOL_PORT (log: $POOL_LOG)"
    pid="$(PATH="$ROOT/.venv/bin:$PATH" PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" spawn "$POOL_PIDFILE" "$POOL_LOG" \
        "$VENV_PY" -m pipelines.worker_pool --service_port="$POOL_PORT")"
    await "worker pool" "$pid" "$POOL_PIDFILE" "$POOL_LOG" port_open "$POOL_PORT"
}

# serve: the standing Beam job server for the running cluster.
serve() {
    local pid
    answers || { log "the cluster is down; run: make flink-up"; exit 1; }
    if ! pid="$(js_pid)"; then
        if port_open "$JOB_PORT"; then
            log "127.0.0.1:$JOB_PORT is taken by a process this script did not start;" \
                "stop it or choose another port with FLINK_JOB_PORT=..."
            exit 1
        fi
        [[ -f "$JOBSERVER_JAR" ]] || { log "no job server jar; run: make flink-jobserver"; exit 1; }
        mkdir -p "$STATE/artifacts"
        log "starting the job server on 127.0.0.1:$JOB_PORT for $URL (log: $JS_LOG)"
        pid="$(spawn "$JS_PIDFILE" "$JS_LOG" \
            java -Xmx1g -jar "$JOBSERVER_JAR" --flink-master "127.0.0.1:$PORT" \
            --job-host 127.0.0.1 --job-port "$JOB_PORT" --artifact-port 0 \
            --expansion-port 0 --artifacts-dir "$STATE/artifacts")"
    fi
    await "job server" "$pid" "$JS_PIDFILE" "$JS_LOG" port_open "$JOB_PORT"
}

# warm: after `up` started any part, $FLINK_WARM_JOBS (default 2) small `features` jobs (20
# users) through the standing job server and the worker pool, as a user submits them. They prove
# the whole path runs Python work (a TaskManager that cannot reach the pool fails here, with the
# job's log, not in the user's first job), and they load and compile the JVMs' classes: a 200-user
# job right after a cold start took 15.8-19.5 s here, 11-12 s after one warm-up job, 8-8.5 s
# after two (docs/operations/flink.md). FLINK_WARM_JOBS=0 skips it, and a cluster with a job
# running (it is in use, so warm; its slots may be taken) is left alone.
warm() {
    local jobs="${FLINK_WARM_JOBS:-2}" dir="$STATE/warm" i started
    ((jobs > 0)) || return 0
    if curl -fsS -m 3 "$URL/jobs/overview" 2>/dev/null | grep -q '"state":"RUNNING"'; then
        log "a job is running: no warm-up jobs"
        return 0
    fi
    mkdir -p "$dir"
    : >"$dir/warm.log"
    if [[ ! -f "$dir/events.parquet" ]]; then
        "$VENV_PY" -m pipelines generate --users 20 --days 3 --output "$dir/events.parquet" \
            --overwrite >>"$dir/warm.log" 2>&1 || { log "could not generate the warm-up input; see $dir/warm.log"; exit 1; }
    fi
    for ((i = 1; i <= jobs; i++)); do
        started=$SECONDS
        if ! (cd "$ROOT" && "$VENV_PY" -m pipelines features --input "$dir/events.parquet" --output "$dir/out" \
            --overwrite --runner FlinkRunner --flink_master "127.0.0.1:$PORT" --parallelism "$TASKMANAGERS" \
            >>"$dir/warm.log" 2>&1); then
            log "warm-up job $i of $jobs failed: the cluster does not run a Beam job; last lines of $dir/warm.log:"
            tail -n 30 "$dir/warm.log" >&2
            exit 1
        fi
        log "warm-up job $i of $jobs (features, 20 users, through the job server and the worker pool): $((SECONDS - started)) s"
    done
}

# parts: the pids of every part `up` starts, on one line (a part that is down: nothing).
parts() { echo "$(js_pid || true) $(pool_pid || true)" $(jm_pids) $(tm_pids); }

up() {
    local before
    before="$(parts)"
    start_flink
    start_pool
    serve
    [[ "$(parts)" == "$before" ]] || warm
    log "up on $URL: jobmanager pid $(jm_pids | head -n 1), taskmanager pids $(tm_pids | tr '\n' ' ')" \
        "($SLOTS slots each), worker pool pid $(pool_pid) on 127.0.0.1:$POOL_PORT," \
        "job server pid $(js_pid) on 127.0.0.1:$JOB_PORT"
}

down() {
    local pids p pid
    if pid="$(js_pid)"; then
        log "stopping the job server (pid $pid)"
        stop_pid "$pid"
    fi
    rm -f "$JS_PIDFILE"
    if pid="$(pool_pid)"; then
        log "stopping the worker pool (pid $pid) and its workers"
        kill -TERM -- "-$pid" 2>/dev/null || true # its process group (spawn's setsid): the workers too
        stop_pid "$pid"
    fi
    rm -f "$POOL_PIDFILE"
    pids="$(jm_pids) $(tm_pids)"
    if [[ -z "${pids// /}" ]]; then
        rm -f "$JM_PIDFILE" "$TM_PIDFILE"
        log "down"
        return 0
    fi
    log "stopping pids" $pids
    for p in $pids; do
        kill -TERM "$p" 2>/dev/null || true
    done
    for p in $pids; do
        stop_pid "$p"
    done
    rm -f "$JM_PIDFILE" "$TM_PIDFILE"
    log "down"
}

status() {
    local o js pool
    if o="$(overview)" && answers; then
        echo "flink: up (jobmanager pid $(jm_pids | head -n 1 || true)) on $URL:" \
            "$(json_int taskmanagers "$o") taskmanager(s), $(json_int slots-available "$o")/$(json_int slots-total "$o") slots free," \
            "$(json_int jobs-running "$o") job(s) running; home $FLINK_HOME"
        [[ -f "$JOBSERVER_JAR" ]] || echo "flink: no job server jar yet (build it with: make flink-jobserver)"
        if js="$(js_pid)" && port_open "$JOB_PORT"; then
            echo "flink: standing job server up (pid $js) on 127.0.0.1:$JOB_PORT"
        else
            echo "flink: no standing job server (run: make flink-up)"
        fi
        if pool="$(pool_pid)" && port_open "$POOL_PORT"; then
            echo "flink: SDK worker pool up (pid $pool) on 127.0.0.1:$POOL_PORT"
        else
            echo "flink: no SDK worker pool (run: make flink-up)"
        fi
        return 0
    fi
    echo "flink: down (start it with: make flink-up)"
    return 3
}

# jobserver: Beam's Flink job server, shaded by Maven from deploy/flink/pom.xml (once).
jobserver() {
    if [[ ! -f "$JOBSERVER_JAR" ]]; then
        command -v mvn >/dev/null || { log "Maven (mvn) is needed to build the job server"; exit 1; }
        local build="$JARS/build/flink-$MINOR-$BEAM_RUNNER_VERSION"
        log "building $(basename "$JOBSERVER_JAR") with Maven (deploy/flink/pom.xml; ~1 min, ~160 MB) ..."
        rm -rf "$build"
        mkdir -p "$JARS"
        mvn -q -B -Dstyle.color=never -f "$DEPLOY/pom.xml" package -Dbuild.dir="$build" \
            -Dbeam.version="$BEAM_RUNNER_VERSION" -Dflink.minor="$MINOR" >&2
        mv "$build/$(basename "$JOBSERVER_JAR")" "$JOBSERVER_JAR.tmp"
        mv "$JOBSERVER_JAR.tmp" "$JOBSERVER_JAR"
        rm -rf "$build"
        log "built $JOBSERVER_JAR ($(du -m "$JOBSERVER_JAR" | cut -f1) MB)"
    fi
    echo "$JOBSERVER_JAR"
}

mkdir -p "$STATE"
lock() { state_lock 300; }

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
    serve)
        lock
        serve
        ;;
    jobserver)
        exec 8>"$STATE/.jobserver.lock"
        flock -w 600 8 || { log "another build of the job server has run for 600 s"; exit 1; }
        jobserver
        ;;
    *)
        echo "usage: $0 up|down|status|jobserver|serve" >&2
        exit 2
        ;;
esac
