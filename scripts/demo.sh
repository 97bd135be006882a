#!/usr/bin/env bash
# make demo: generate a world of ~1M events, build histories and training examples,
# inspect them, and print where everything is. Embedded defaults, no services.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
DEMO_DIR="${DEMO_DIR:-out/demo}"
USERS="${DEMO_USERS:-20000}"
DAYS="${DEMO_DAYS:-14}"
mkdir -p "$DEMO_DIR"
start=$(date +%s)

step() { echo; echo "=== $*"; }

step "1/3 generate: $USERS users x $DAYS days (with a few malformed lines and redeliveries)"
rm -rf "$DEMO_DIR/events.jsonl.gz" "$DEMO_DIR/events.truth"
$PY -m pipelines generate --users "$USERS" --days "$DAYS" --seed 7 \
    --output "$DEMO_DIR/events.jsonl.gz" --candidates "$DEMO_DIR/candidates.parquet" \
    --bad-fraction 0.0005 --duplicate-fraction 0.002

step "2/3 features: histories + point-in-time training examples (Beam, local runner)"
$PY -m pipelines features --input "$DEMO_DIR/events.jsonl.gz" --output "$DEMO_DIR/features" --overwrite

step "check: the pipeline's counts against what the generator injected"
$PY - "$DEMO_DIR" <<'PYEOF'
import json, sys
root = sys.argv[1]
world = json.load(open(f"{root}/events.truth/world.json"))["counts"]
summary = json.load(open(f"{root}/features/summary.json"))
pairs = [("valid events", world["events"], summary["events_valid"]),
         ("redeliveries", world["duplicates"], summary["duplicates"]),
         ("malformed lines", world["bad_lines_total"], summary["dead_letters"])]
for name, injected, seen in pairs:
    print(f"  {name:<16} generated {injected:>9}  pipeline {seen:>9}  {'ok' if injected == seen else 'MISMATCH'}")
sys.exit(0 if all(a == b for _, a, b in pairs) else 1)
PYEOF

step "3/3 inspect"
$PY -m pipelines inspect "$DEMO_DIR/features" --plot "$DEMO_DIR/features.png"

step "done in $(( $(date +%s) - start )) s; outputs:"
cat <<EOF2
  events           $DEMO_DIR/events.jsonl.gz  (ground truth: $DEMO_DIR/events.truth/)
  candidates       $DEMO_DIR/candidates.parquet
  histories        $DEMO_DIR/features/histories/shard=*/part-*.parquet
  training examples $DEMO_DIR/features/training_examples/shard=*/part-*.parquet
  dead letters     $DEMO_DIR/features/dead_letters/part-00000.parquet
  counts           $DEMO_DIR/features/summary.json
  plot             $DEMO_DIR/features.png
  look at a user:  $PY -m pipelines inspect $DEMO_DIR/features --user 1
EOF2
