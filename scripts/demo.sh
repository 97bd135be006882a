#!/usr/bin/env bash
# make demo: the main job end to end on embedded defaults (no services):
# generate ~1M events -> features (histories, training examples) -> train the GEM model ->
# precompute representations into Parquet + an embedded LMDB store -> FAISS index ->
# resolve a few requests with fallbacks -> transfer to downstream rankers -> inspect. DEMO_STAGES=features stops after features.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
DEMO_DIR="${DEMO_DIR:-out/demo}"
USERS="${DEMO_USERS:-20000}"
DAYS="${DEMO_DAYS:-14}"
REQUESTS="${DEMO_REQUESTS:-800}"
STAGES="${DEMO_STAGES:-all}"
mkdir -p "$DEMO_DIR"
start=$(date +%s)

step() { echo; echo "=== $*"; }

step "1/7 generate: $USERS users x $DAYS days (with a few malformed lines and redeliveries)"
rm -rf "$DEMO_DIR/events.jsonl.gz" "$DEMO_DIR/events.truth"
$PY -m pipelines generate --users "$USERS" --days "$DAYS" --seed 7 \
    --output "$DEMO_DIR/events.jsonl.gz" --candidates-output "$DEMO_DIR/candidates.parquet" --overwrite \
    --requests "$REQUESTS" --bad-fraction 0.0005 --duplicate-fraction 0.002

step "2/7 features: histories + point-in-time training examples (Beam, local runner)"
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

step "inspect features"
$PY -m pipelines inspect "$DEMO_DIR/features" --plot "$DEMO_DIR/features.png"

if [[ "$STAGES" != "features" ]]; then
    step "3/7 train: GEM-style model vs count baseline on a last-day holdout"
    $PY -m pipelines train --features "$DEMO_DIR/features" --output "$DEMO_DIR/model" --overwrite \
        | tail -1
    $PY -c "import json,sys; m=json.load(open(sys.argv[1])); print('  holdout click AUC: model %.4f, baseline %.4f' % (m['model']['click']['auc'], m['baseline']['click']['auc']))" "$DEMO_DIR/model/metrics.json"

    step "4/7 precompute: $REQUESTS candidate requests + every user -> representations (RunInference, token budget)"
    rm -rf "$DEMO_DIR/store"
    $PY -m pipelines precompute --features "$DEMO_DIR/features" --candidates "$DEMO_DIR/candidates.parquet" \
        --model "$DEMO_DIR/model" --output "$DEMO_DIR/precompute" --all-users \
        --store "lmdb://$(realpath "$DEMO_DIR")/store" --overwrite | tail -1
    $PY -m pipelines inspect "$DEMO_DIR/precompute" | tail -1

    step "5/7 + 6/7 index users in FAISS and resolve requests (exact -> same user -> similar users -> none)"
    bash scripts/demo_similarity.sh "$DEMO_DIR"

    step "7/7 transfer: downstream rankers alone / distilled / with representations"
    bash scripts/demo_transfer.sh "$DEMO_DIR"
fi

step "done in $(( $(date +%s) - start )) s; outputs:"
cat <<EOF2
  events           $DEMO_DIR/events.jsonl.gz  (ground truth: $DEMO_DIR/events.truth/)
  candidates       $DEMO_DIR/candidates.parquet
  histories        $DEMO_DIR/features/histories/shard=*/part-*.parquet
  training examples $DEMO_DIR/features/training_examples/shard=*/part-*.parquet
  dead letters     $DEMO_DIR/features/dead_letters/part-00000.parquet
  counts           $DEMO_DIR/features/summary.json
  plot             $DEMO_DIR/features.png
  model            $DEMO_DIR/model/model.pt  (metrics: $DEMO_DIR/model/metrics.json)
  representations  $DEMO_DIR/precompute/representations/shard=*/part-*.parquet
  online store     $DEMO_DIR/store  (LMDB)
  FAISS index      $DEMO_DIR/index
  look at a user:  $PY -m pipelines inspect $DEMO_DIR/features --user 1
EOF2
