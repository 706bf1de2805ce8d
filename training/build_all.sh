#!/usr/bin/env bash
# Rebuild brisk's bundled models end to end: data -> tokenizer -> target -> draft -> assets.
# About an hour on 2 CPU cores (see training/README.md). Run from the repository root:
#   nice -n 10 bash training/build_all.sh            # then: python -m training.evaluate
# Environment overrides: OUT (work dir), TARGET_STEPS, DRAFT_STEPS, THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-training/out}
TARGET_STEPS=${TARGET_STEPS:-900}
DRAFT_STEPS=${DRAFT_STEPS:-1500}
THREADS=${THREADS:-2}
ASSETS=src/brisklm/assets
start=$(date +%s)

python -m training.generate_data --out "$OUT/data" --seed 1234 --num-train 50000 --num-eval 200
python -m training.train_tokenizer --data "$OUT/data/train.jsonl" --out "$OUT/tokenizer" --vocab-size 4096
python -m training.train --preset target --data "$OUT/data" --tokenizer "$OUT/tokenizer" \
    --out "$OUT/brisk-chat" --steps "$TARGET_STEPS" --batch-size 12 --seq-len 640 --lr 2e-3 \
    --warmup 50 --threads "$THREADS"
python -m training.train --preset draft --data "$OUT/data" --tokenizer "$OUT/tokenizer" \
    --out "$OUT/brisk-draft" --steps "$DRAFT_STEPS" --batch-size 12 --seq-len 640 --lr 3e-3 \
    --warmup 50 --threads "$THREADS"

for name in brisk-chat brisk-draft; do
    rm -rf "${ASSETS:?}/$name"
    mkdir -p "$ASSETS/$name"
    cp "$OUT/$name/model/"* "$ASSETS/$name/"
done
echo "build_all: done in $(( ($(date +%s) - start) / 60 )) min; models in $ASSETS/brisk-chat and $ASSETS/brisk-draft"
