#!/usr/bin/env bash
# Rebuild brisk's bundled models end to end: data -> tokenizer -> target -> draft -> assets.
# About an hour on 2 CPU cores (see training/README.md). Run from the repository root:
#   nice -n 10 bash training/build_all.sh            # then: python -m training.evaluate
# Environment overrides: OUT (work dir), TARGET_STEPS, DRAFT_STEPS, THREADS, TIME_BUDGET_MIN.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-training/out}
TARGET_STEPS=${TARGET_STEPS:-720}
DRAFT_STEPS=${DRAFT_STEPS:-1200}
THREADS=${THREADS:-2}
# Optional: a wall-time budget (minutes) for the target on a busy machine; see training/README.md.
TIME_BUDGET_MIN=${TIME_BUDGET_MIN:-}
budget_args=()
if [[ -n "$TIME_BUDGET_MIN" ]]; then budget_args=(--time-budget-min "$TIME_BUDGET_MIN"); fi
ASSETS=src/brisklm/assets
start=$(date +%s)

python -m training.generate_data --out "$OUT/data" --seed 1234 --num-train 50000 --num-eval 200
python -m training.train_tokenizer --data "$OUT/data/train.jsonl" --out "$OUT/tokenizer" --vocab-size 4096
# The draft (about a fifth of the compute) trains alongside the target, on one thread.
python -m training.train --preset draft --data "$OUT/data" --tokenizer "$OUT/tokenizer" \
    --out "$OUT/brisk-draft" --steps "$DRAFT_STEPS" --batch-size 12 --seq-len 640 --lr 3e-3 \
    --warmup 50 --threads 1 > "$OUT/draft.log" 2>&1 &
draft_pid=$!
python -m training.train --preset target --data "$OUT/data" --tokenizer "$OUT/tokenizer" \
    --out "$OUT/brisk-chat" --steps "$TARGET_STEPS" --batch-size 12 --seq-len 640 --lr 2e-3 \
    --warmup 50 --threads "$THREADS" --loss-on all "${budget_args[@]}"
wait "$draft_pid"
tail -n 3 "$OUT/draft.log"

for name in brisk-chat brisk-draft; do
    rm -rf "${ASSETS:?}/$name"
    mkdir -p "$ASSETS/$name"
    cp "$OUT/$name/model/"* "$ASSETS/$name/"
done
echo "build_all: done in $(( ($(date +%s) - start) / 60 )) min; models in $ASSETS/brisk-chat and $ASSETS/brisk-draft"
