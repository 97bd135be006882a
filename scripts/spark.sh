#!/usr/bin/env bash
# Beam's Spark 3 job server (Spark 3.5 in-process, master local[N]) for the Spark runner.
#
#   scripts/spark.sh jobserver  build the job server jar once (Maven, deploy/spark/pom.xml)
#                               and print its path on stdout
#   scripts/spark.sh up         start a standing job server on 127.0.0.1:$SPARK_JOB_PORT
#                               (for --runner PortableRunner --job_endpoint 127.0.0.1:8199)
#   scripts/spark.sh down       stop the job server started by `up`
#   scripts/spark.sh status     exit 0 when the job server accepts connections, 3 when it is down
#   scripts/spark.sh java-opts  print the JVM flags Spark 3.5 needs on Java 17
#
# `--runner SparkRunner --spark_job_server_jar JAR --spark_master_url 'local[2]'` needs no
# standing server: Beam starts `java -jar JAR` itself and adds four --add-opens flags
# (apache_beam/runners/portability/spark_runner.py). A job server started any other way
# (`up`, or java -jar by hand) needs the flags that `java-opts` prints. State (pid file,
# log, artifacts) lives under $SPARK_STATE (default .cache/spark, git-ignored).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEPLOY="$ROOT/deploy/spark"
STATE="${SPARK_STATE:-$ROOT/.cache/spark}"
# The runner's version: deploy/versions.env (the one place; the environment may override).
BEAM_RUNNER_VERSION="${BEAM_SPARK_RUNNER_VERSION:-$(sed -n 's/^BEAM_SPARK_RUNNER_VERSION=//p' "$ROOT/deploy/versions.env")}"
JARS="$ROOT/.cache/jars"
JOBSERVER_JAR="$JARS/beam-runners-spark-3-job-server-$BEAM_RUNNER_VERSION.jar"
JOB_PORT="${SPARK_JOB_PORT:-8199}"
ARTIFACT_PORT=$((JOB_PORT - 1))
EXPANSION_PORT=$((JOB_PORT - 2))
MASTER="${SPARK_MASTER_URL:-local[2]}"
HEAP="${SPARK_JOBSERVER_HEAP:--Xmx2g}"
WAIT_S="${SPARK_WAIT_S:-120}"
PIDFILE="$STATE/jobserver.pid"
LOG="$STATE/jobserver.log"
JAVA="${JAVA:-java}"

# Spark 3.5 on Java 17: the module openings of Spark's own launcher
# (org.apache.spark.launcher.JavaModuleOptions); Beam's four are a subset.
JAVA_OPTS=(
    -XX:+IgnoreUnrecognizedVMOptions
    --add-opens=java.base/java.lang=ALL-UNNAMED
    --add-opens=java.base/java.lang.invoke=ALL-UNNAMED
    --add-opens=java.base/java.lang.reflect=ALL-UNNAMED
    --add-opens=java.base/java.io=ALL-UNNAMED
    --add-opens=java.base/java.net=ALL-UNNAMED
    --add-opens=java.base/java.nio=ALL-UNNAMED
    --add-opens=java.base/java.util=ALL-UNNAMED
    --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
    --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED
    --add-opens=java.base/jdk.internal.ref=ALL-UNNAMED
    --add-opens=java.base/sun.nio.ch=ALL-UNNAMED
    --add-opens=java.base/sun.nio.cs=ALL-UNNAMED
    --add-opens=java.base/sun.security.action=ALL-UNNAMED
    --add-opens=java.base/sun.util.calendar=ALL-UNNAMED
    -Djdk.reflect.useDirectMethodHandle=false
)

log() { echo "spark: $*" >&2; }

# shellcheck source=scripts/service-lib.sh
source "$ROOT/scripts/service-lib.sh"

our_pid() { pid_from "$PIDFILE" "SparkJobServerDriver\|spark-3-job-server"; }

# jobserver: Beam's Spark job server, shaded by Maven from deploy/spark/pom.xml (once).
jobserver() {
    if [[ ! -f "$JOBSERVER_JAR" ]]; then
        command -v mvn >/dev/null || { log "Maven (mvn) is needed to build the job server"; exit 1; }
        local build="$JARS/build/spark-3-$BEAM_RUNNER_VERSION"
        log "building $(basename "$JOBSERVER_JAR") with Maven (deploy/spark/pom.xml; ~1 min, ~310 MB) ..."
        rm -rf "$build"
        mkdir -p "$JARS"
        mvn -q -B -Dstyle.color=never -f "$DEPLOY/pom.xml" package -Dbuild.dir="$build" \
            -Dbeam.version="$BEAM_RUNNER_VERSION" >&2
        mv "$build/$(basename "$JOBSERVER_JAR")" "$JOBSERVER_JAR.tmp"
        mv "$JOBSERVER_JAR.tmp" "$JOBSERVER_JAR"
        rm -rf "$build"
        rmdir "$JARS/build" 2>/dev/null || true
        log "built $JOBSERVER_JAR ($(du -m "$JOBSERVER_JAR" | cut -f1) MB)"
    fi
    echo "$JOBSERVER_JAR"
}

up() {
    local pid
    if pid="$(our_pid)"; then
        if port_open "$JOB_PORT"; then
            log "job server already up (pid $pid) on 127.0.0.1:$JOB_PORT"
            return 0
        fi
        log "pid $pid is starting; waiting"
    else
        if port_open "$JOB_PORT"; then
            log "127.0.0.1:$JOB_PORT is taken by a process this script did not start;" \
                "stop it or choose another port with SPARK_JOB_PORT=..."
            exit 1
        fi
        command -v "$JAVA" >/dev/null || { log "Java 17 is needed to run the job server"; exit 1; }
        [[ -f "$JOBSERVER_JAR" ]] || jobserver >/dev/null
        mkdir -p "$STATE/artifacts"
        [[ -f "$LOG" ]] && mv -f "$LOG" "$LOG.1"
        log "starting the Spark job server on 127.0.0.1:$JOB_PORT, master $MASTER (log: $LOG)"
        # shellcheck disable=SC2086
        pid="$(spawn "$PIDFILE" "$LOG" \
            "$JAVA" $HEAP "${JAVA_OPTS[@]}" -jar "$JOBSERVER_JAR" \
            --spark-master-url "$MASTER" --job-host 127.0.0.1 --job-port "$JOB_PORT" \
            --artifact-port "$ARTIFACT_PORT" --expansion-port "$EXPANSION_PORT" \
            --artifacts-dir "$STATE/artifacts")"
    fi
    await "job server" "$pid" "$PIDFILE" "$LOG" port_open "$JOB_PORT"
    log "up (pid $pid): --runner PortableRunner --job_endpoint 127.0.0.1:$JOB_PORT --environment_type LOOPBACK"
}

down() { stop_ours "$PIDFILE"; }

status() {
    local pid
    if pid="$(our_pid)" && port_open "$JOB_PORT"; then
        echo "spark: job server up (pid $pid) on 127.0.0.1:$JOB_PORT, master $MASTER; state $STATE"
        return 0
    fi
    echo "spark: job server down (start it with: bash scripts/spark.sh up)"
    return 3
}

mkdir -p "$STATE"
lock() { state_lock 600; }

case "${1:-}" in
    jobserver)
        lock
        jobserver
        ;;
    up)
        lock
        up
        ;;
    down)
        lock
        down
        ;;
    status) status ;;
    java-opts) echo "${JAVA_OPTS[*]}" ;;
    *)
        echo "usage: $0 jobserver|up|down|status|java-opts" >&2
        exit 2
        ;;
esac
