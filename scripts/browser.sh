#!/usr/bin/env bash
# The browser the HTML report tests open pages in: Debian's headless-capable Chromium and its
# WebDriver (chromium-driver), driven by Selenium against these system binaries (no browser
# is ever downloaded at run time).
#
#   scripts/browser.sh install   apt-get install chromium chromium-driver if either is missing
#   scripts/browser.sh status    exit 0 when both are installed (prints their versions), 3 if not
#
# Tests find them at /usr/bin/chromium and /usr/bin/chromedriver, or at GEM_CHROMIUM and
# GEM_CHROMEDRIVER.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STATE="${BROWSER_STATE:-$ROOT/.cache/browser}"
CHROMIUM="${GEM_CHROMIUM:-/usr/bin/chromium}"
DRIVER="${GEM_CHROMEDRIVER:-/usr/bin/chromedriver}"

log() { echo "browser: $*" >&2; }

# shellcheck source=scripts/service-lib.sh
source "$ROOT/scripts/service-lib.sh"

present() { [[ -x "$CHROMIUM" && -x "$DRIVER" ]]; }

install() {
    present && return 0
    mkdir -p "$STATE"
    state_lock 600
    present && return 0
    apt_install "$STATE/apt.log" chromium chromium-driver
    present || { log "installed, but $CHROMIUM or $DRIVER is still missing"; exit 1; }
    log "installed $("$CHROMIUM" --version 2>/dev/null)"
}

status() {
    if present; then
        echo "browser: $("$CHROMIUM" --version 2>/dev/null); $("$DRIVER" --version 2>/dev/null | cut -d' ' -f1-2)"
        return 0
    fi
    echo "browser: not installed (install it with: make browser)"
    return 3
}

case "${1:-}" in
    install) install ;;
    status) status ;;
    *)
        echo "usage: $0 install|status" >&2
        exit 2
        ;;
esac
