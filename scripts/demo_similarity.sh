#!/usr/bin/env bash
# Similar-user fallback, as a demo step: index the user representations of a precompute output,
# then resolve a few of the generator's candidate requests and print the path each ad took.
#
#   scripts/demo_similarity.sh DEMO_DIR
#
# Needs DEMO_DIR/candidates.parquet (generate --candidates-output) and DEMO_DIR/precompute, written by
#   python -m pipelines precompute ... --output DEMO_DIR/precompute --all-users --store lmdb://DEMO_DIR/store
# (STORE=uri overrides the store; REQUESTS=n how many requests are resolved, default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
DIR="${1:?usage: scripts/demo_similarity.sh DEMO_DIR}"
STORE="${STORE:-lmdb://$(realpath "$DIR")/store}"
REQUESTS="${REQUESTS:-3}"

echo "=== index: user representations -> FAISS (Beam; 2 shards merged)"
$PY -m pipelines index --representations "$DIR/precompute" --output "$DIR/index" --shards 2 --overwrite | tail -1

echo "=== lookup: $REQUESTS requests of 6 of the user's precomputed ads + 6 of another user's; default policy,"
echo "    then pairs only (no user-level answer: what a consumer of pair representations gets)"
$PY - "$DIR/candidates.parquet" "$REQUESTS" <<'PYEOF' |
import sys
import pyarrow.parquet as pq
table = pq.read_table(sys.argv[1], columns=["user_id", "ad_ids"]).to_pylist()
step = max(1, len(table) // int(sys.argv[2]))
for i in range(0, step * int(sys.argv[2]), step):
    row, other = table[i], table[(i + len(table) // 2) % len(table)]
    ads = list(dict.fromkeys(row["ad_ids"][:6] + other["ad_ids"][:6]))
    print(row["user_id"], ",".join(map(str, ads)))
PYEOF
while read -r user ads; do
    echo "--- user $user"
    $PY -m pipelines lookup --store "$STORE" --index "$DIR/index" --user "$user" --ads "$ads" | tail -1
    $PY -m pipelines lookup --store "$STORE" --index "$DIR/index" --user "$user" --ads "$ads" \
        --paths same_user_pair,similar_users
done
