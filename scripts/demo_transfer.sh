#!/usr/bin/env bash
# Transfer to downstream models, as a demo step: train small rankers alone, distilled from the GEM
# model and with its as-of representations, and print the headline (variants, gains, ratio).
#
#   scripts/demo_transfer.sh DEMO_DIR
#
# Needs DEMO_DIR/features (python -m pipelines features) and DEMO_DIR/model (python -m pipelines train).
# TRANSFER_ARGS overrides the demo's small sizes (the command's defaults are larger and slower).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
DIR="${1:?usage: scripts/demo_transfer.sh DEMO_DIR}"
ARGS="${TRANSFER_ARGS:---max-train 4000 --max-holdout 4000 --seeds 2 --epochs 3}"

echo "=== transfer: click on every surface; rankers alone / distilled / with representations (as-of, 6h snapshots)"
# shellcheck disable=SC2086
$PY -m pipelines transfer --features "$DIR/features" --model "$DIR/model" --output "$DIR/transfer" \
    --objective click --cadence 6h --overwrite --no-progress $ARGS
