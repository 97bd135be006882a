#!/usr/bin/env bash
# Rewrite constraints.txt, the lock that `make setup` installs from (`make lock` runs this).
#
# 1. A fresh venv installs '.[dev]' with no constraints: the newest versions that the ranges in
#    pyproject.toml allow. Its `pip freeze --all --exclude-editable` is the locked set that
#    .venv and CI install.
# 2. The extra that .venv does not install (gpu) is resolved against that set
#    (pip install --dry-run --report, nothing installed) and locked below it, so
#    `pip install -c constraints.txt '.[gpu]'` is reproducible too.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
WORK=${LOCK_WORK:-.cache/lock}
OUT=${LOCK_OUT:-constraints.txt}
rm -rf "$WORK" && mkdir -p "$WORK"
"$PYTHON" -m venv "$WORK/venv"
PIP="$WORK/venv/bin/python -m pip"
$PIP install -q --upgrade pip
$PIP install -q -e '.[dev]'
$PIP check
$PIP freeze --all --exclude-editable > "$WORK/dev.txt"
$PIP install -q --dry-run --ignore-installed -c "$WORK/dev.txt" --report "$WORK/extras.json" '.[gpu]'

"$WORK/venv/bin/python" - "$WORK/dev.txt" "$WORK/extras.json" > "$OUT" <<'EOF'
import json
import re
import sys

def key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()

dev = [line.strip() for line in open(sys.argv[1]) if "==" in line]
have = {key(line.split("==")[0]) for line in dev}
report = json.load(open(sys.argv[2]))
added = [item["metadata"] for item in report["install"]]
extras = [
    f"{m['name']}=={m['version']}"
    for m in sorted(added, key=lambda m: key(m["name"]))
    if key(m["name"]) not in have | {"gem-pipelines"}
]
print("""\
# The lock: every package at the version CI tests, transitive ones included. Written by
# `make lock` (scripts/lock.sh) from the ranges in pyproject.toml; do not edit by hand.
# `make setup` installs with  pip install -c constraints.txt -e '.[dev]'  and any other
# install can do the same, e.g.  pip install -c constraints.txt '.[gpu,kafka]'.
# apache-beam's line is the project's one statement of the Beam SDK version (the Makefile
# reads it for Prism; deploy/versions.env pairs it with the Flink runner).
#
# Section 1: a '.[dev]' install (pip freeze --all --exclude-editable).""")
print("\n".join(dev))
print("""
# Section 2: what the extra outside dev adds, resolved against section 1 (pip install
# --dry-run '.[gpu]'); pip uses a line only when an install needs that package.""")
print("\n".join(extras))
EOF
echo "wrote $OUT: $(grep -c '==' "$OUT") packages; now run: make setup"
