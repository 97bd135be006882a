#!/usr/bin/env bash
# The project's S3-compatible object store: S3Proxy (filesystem backend) on 127.0.0.1.
#
#   scripts/s3proxy.sh up       fetch the jar (Maven, first run only), start the server, wait
#   scripts/s3proxy.sh down     stop the server started by `up` (SIGTERM, then SIGKILL after 30 s)
#   scripts/s3proxy.sh status   exit 0 when the server answers, 3 when it is down
#   scripts/s3proxy.sh jar      only fetch the jar into .cache/jars/s3proxy
#   scripts/s3proxy.sh env      print the AWS_* variables that point a client at it (eval "$(...)")
#
# The jar comes from Maven Central (deploy/s3proxy/pom.xml) into .cache/jars/s3proxy/. State lives
# under $S3PROXY_STATE (default .cache/s3proxy, git-ignored): data/ (one folder per bucket, objects
# as files), s3proxy.properties (rendered from deploy/s3proxy/s3proxy.properties.in), s3proxy.log,
# s3proxy.pid. `up` is idempotent and creates the bucket $S3PROXY_BUCKET (default gem).
# Port: $S3PROXY_PORT (default 19900). The identity is a fixed local test one (see the properties).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEPLOY="$ROOT/deploy/s3proxy"
STATE="${S3PROXY_STATE:-$ROOT/.cache/s3proxy}"
PORT="${S3PROXY_PORT:-19900}"
BUCKET="${S3PROXY_BUCKET:-gem}"
HEAP="${S3PROXY_HEAP:--Xms64m -Xmx256m}"
WAIT_S="${S3PROXY_WAIT_S:-60}"
JARS="$ROOT/.cache/jars/s3proxy"
PIDFILE="$STATE/s3proxy.pid"
LOG="$STATE/s3proxy.log"
JAVA="${JAVA:-java}"

log() { echo "s3proxy: $*" >&2; }

# shellcheck source=scripts/service-lib.sh
source "$ROOT/scripts/service-lib.sh"

our_pid() { pid_from "$PIDFILE" "org.gaul.s3proxy.Main"; }  # the server started from this state dir, if alive

fetch_jar() {
    local stamp="$JARS/.resolved"
    if [[ -f "$stamp" && "$stamp" -nt "$DEPLOY/pom.xml" ]]; then
        return 0
    fi
    command -v mvn >/dev/null || { log "Maven (mvn) is needed to fetch S3Proxy's jar"; exit 1; }
    log "fetching S3Proxy from Maven Central (deploy/s3proxy/pom.xml) ..."
    local tmp="$JARS.tmp"
    rm -rf "$tmp"
    mkdir -p "$(dirname "$JARS")"
    mvn -q -B -Dstyle.color=never -f "$DEPLOY/pom.xml" dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$tmp" >&2
    rm -rf "$JARS"
    mv "$tmp" "$JARS"
    touch "$JARS/.resolved"
    log "$(cd "$JARS" && ls ./*.jar) in $JARS"
}

# The data folder as a physical path (pwd -P): a server started through a symlinked checkout keeps
# working after that checkout is gone.
render_config() {
    local physical
    physical="$(cd "$STATE" && pwd -P)"
    sed -e "s|@PORT@|$PORT|g" -e "s|@STATE@|$physical|g" "$DEPLOY/s3proxy.properties.in" >"$STATE/s3proxy.properties"
}

up() {
    if pid="$(our_pid)"; then
        if started; then
            log "already up (pid $pid) on http://127.0.0.1:$PORT"
            mkdir -p "$STATE/data/$BUCKET"
            return 0
        fi
        log "pid $pid is starting; waiting"
    else
        if port_open "$PORT"; then
            log "127.0.0.1:$PORT is taken by a process this script did not start;" \
                "stop it or choose another port with S3PROXY_PORT=..."
            exit 1
        fi
        command -v "$JAVA" >/dev/null || { log "Java 17+ is needed to run S3Proxy"; exit 1; }
        fetch_jar
        mkdir -p "$STATE/data/$BUCKET"
        render_config
        [[ -f "$LOG" ]] && mv -f "$LOG" "$LOG.1"
        log "starting S3Proxy on http://127.0.0.1:$PORT (data: $STATE/data, log: $LOG)"
        # -cp and the main class (not -jar) so that our_pid finds the class name in the command line.
        # shellcheck disable=SC2086
        pid="$(spawn "$PIDFILE" "$LOG" "$JAVA" $HEAP -Djava.awt.headless=true \
            -cp "$(cd "$JARS" && pwd -P)/*" org.gaul.s3proxy.Main \
            --properties "$(cd "$STATE" && pwd -P)/s3proxy.properties")"
    fi
    await S3Proxy "$pid" "$PIDFILE" "$LOG" started
    log "up (pid $pid) on http://127.0.0.1:$PORT, bucket s3://$BUCKET"
}

down() { stop_ours "$PIDFILE"; }

# started: the server accepts connections and Jetty has logged that it is serving.
started() { port_open "$PORT" && grep -q "Started Server" "$LOG" 2>/dev/null; }

status() {
    if pid="$(our_pid)" && port_open "$PORT"; then
        echo "s3proxy: up (pid $pid) on http://127.0.0.1:$PORT; state $STATE"
        return 0
    fi
    echo "s3proxy: down (start it with: make s3-up)"
    return 3
}

# The standard AWS variables boto3 (Beam's S3 filesystem) and pyarrow read. The checksum setting:
# boto3 >= 1.36 adds CRC trailers to uploads by default, which S3Proxy 2.6.0 answers NotImplemented.
env_vars() {
    local identity credential
    identity="$(sed -n 's/^s3proxy.identity=//p' "$DEPLOY/s3proxy.properties.in")"
    credential="$(sed -n 's/^s3proxy.credential=//p' "$DEPLOY/s3proxy.properties.in")"
    cat <<VARS
export AWS_ENDPOINT_URL_S3=http://127.0.0.1:$PORT
export AWS_ACCESS_KEY_ID=$identity
export AWS_SECRET_ACCESS_KEY=$credential
export AWS_REGION=us-east-1
export AWS_REQUEST_CHECKSUM_CALCULATION=when_required
export AWS_RESPONSE_CHECKSUM_VALIDATION=when_required
VARS
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    jar) fetch_jar ;;
    env) env_vars ;;
    *)
        echo "usage: $0 up|down|status|jar|env" >&2
        exit 2
        ;;
esac
