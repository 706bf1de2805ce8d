#!/usr/bin/env bash
# Both bundled models in one pass sized for issue 3's budget (about 90 minutes on two CPU cores):
# data -> tokenizer -> seed -> target -> draft. A measured experiment, NOT the shipped weights
# (build_all.sh is the chain that made those, in hours): the target trains once, 4,000 steps, on
# data written with every request style the chain added run by run (the generator's flags of its
# last set), then two 400-step runs from it on two more such sets, and the mean of the three.
# Session 45, on the AMX Xeon (2 vCPUs, compiled bfloat16): 80 minutes end to end; tool calls
# 81.0% of the canonical 200 (77.3% of 2,000 more), extraction 78.1%, draft agreement 88.9%,
# against the shipped 95.0% / 91-92% / 95.3% / 90.9% (training/README.md, "The 90-minute build").
# Run from the repository root:
#   bash training/build_fast.sh
#   python -m training.evaluate --data "$OUT/data" --target "$ASSETS/brisk-chat" \
#       --draft "$ASSETS/brisk-draft"
# Environment overrides as in build_all.sh: OUT (work dir, default training/out-fast), ASSETS (where
# the two models go, default $OUT/assets: the shipped models are left alone), DEVICE (auto, cpu or
# cuda), EAGER=1 (no torch.compile). Interrupted, it resumes the same way: run it again with the
# same OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-training/out-fast}
ASSETS=${ASSETS:-$OUT/assets}
start=$(date +%s)
BUILD=build_fast
# shellcheck source=training/steps.sh
source training/steps.sh

# The canonical first set, as build_all.sh writes it (make_first_set in steps.sh).
make_first_set
# The target's sets: every request style of build_all.sh's last sets (last_styles in steps.sh).
step "$OUT/mix" python -m training.generate_data --out "$OUT/mix" --seed 4545 \
    --num-train 150000 --num-easy 60000 --num-eval 200 "${last_styles[@]}"
for spec in "mix2 5656" "mix3 6767"; do
    read -r name seed <<< "$spec"
    step "$OUT/$name" python -m training.generate_data --out "$OUT/$name" --seed "$seed" \
        --num-train 60000 --num-eval 200 "${last_styles[@]}"
done
make_tokenizer

# 1. The seed, as build_all.sh makes it (make_seed in steps.sh).
make_seed

# 2. The target, with Muon: grown from the seed, 600 steps on easy samples, then the mixed set,
#    20% drill steps of three kinds throughout.
drills=(--drill-frac 0.2 --drill-kinds copy,digits,digits,recall --optimizer muon --fill-long-rows)
step "$OUT/target" python -m training.train --preset target "${common[@]}" --data "$OUT/mix" \
    --out "$OUT/target" --grow-from "$OUT/seed/model" --steps 4000 --easy-steps 600 \
    --lr 3e-3 --warmup 50 --eval-every 2000 "${drills[@]}"
#    Two short runs from it on two more sets, and the mean of the three.
for spec in "target2 mix2 2" "target3 mix3 3"; do
    read -r name data seed <<< "$spec"
    step "$OUT/$name" python -m training.train --preset target "${common[@]}" \
        --data "$OUT/$data" --out "$OUT/$name" --init "$OUT/target/model" --seed "$seed" \
        --steps 400 --lr 6e-4 --warmup 20 --eval-every 400 "${drills[@]}"
done
step "$OUT/brisk-chat" python -m training.average --out "$OUT/brisk-chat/model" \
    "$OUT/target/model" "$OUT/target2/model" "$OUT/target3/model"

# 3. The draft, as build_all.sh makes it (make_draft in steps.sh).
make_draft

install_models
