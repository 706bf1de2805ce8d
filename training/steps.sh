# Sourced by build_all.sh, build_fast.sh and build_gpu.sh after they set BUILD (the script's name
# in messages), start (its start time in seconds), OUT and ASSETS.
# common: every training run's flags (the first set's --data, which a run may follow with its own).
common=(--data "$OUT/data" --tokenizer "$OUT/tokenizer" --batch-tokens 3840 --seq-len 384
        --long-seq-len 896 --threads 2 --device "${DEVICE:-auto}" --resume)
# last_styles: the generator flags of build_all.sh's last sets (more phrasings, 60% tool samples,
# 3-5 tools, open verbs, Cyrillic/Greek values, free-text arguments, docstrings, unit conversions,
# topic questions, reading tools, conversion distractors, CJK names): every request style the chain
# added run by run. build_fast.sh and build_gpu.sh write their targets' sets with them.
last_styles=(--more-phrasings --request-order --tool-share 0.6 --many-tools --open-verbs 0.5
             --other-scripts 0.1 --free-text-args --free-text-share 0.4 --docstrings 0.4
             --conversions 0.12 --topic-questions 1.0 --reader-tools 0.15
             --conversion-distractors 0.25 --native-names 0.04)
# small_talk: a tenth of the tool samples small talk ("Hi there", "Thanks", ...) answered in text
# (session 47): without it a target trained on the last styles alone calls a tool for greetings.
small_talk=(--small-talk 0.1)
# EAGER=1: every training run without torch.compile.
if [[ ${EAGER:-0} == 1 ]]; then
    common+=(--no-compile)
fi

# step DIR COMMAND...: run COMMAND unless DIR holds an earlier finished run's mark; then mark it.
step() {
    local dir=$1
    shift
    if [[ -e "$dir/.built" ]]; then
        echo "$BUILD: $dir was built by an earlier run, skipped"
        return
    fi
    "$@"
    touch "$dir/.built"
    echo "$BUILD: $dir done at minute $(( ($(date +%s) - start) / 60 ))"
}

# make_first_set: the canonical first set, OUT/data (its eval.json is the canonical held-out set,
# its train.jsonl trains the tokenizer and the draft). make_tokenizer: the BPE tokenizer both models
# share, OUT/tokenizer, trained on it.
make_first_set() {
    step "$OUT/data" python -m training.generate_data --out "$OUT/data" --seed 1234 \
        --num-train 150000 --num-easy 60000 --num-eval 200 --request-order
}
make_tokenizer() {
    step "$OUT/tokenizer" python -m training.train_tokenizer --data "$OUT/data/train.jsonl" \
        --out "$OUT/tokenizer" --vocab-size 4096
}

# install_models: the two models (OUT/brisk-chat/model, OUT/brisk-draft/model) into ASSETS, then
# how long the build took.
install_models() {
    local name
    for name in brisk-chat brisk-draft; do
        rm -rf "${ASSETS:?}/$name"
        mkdir -p "$ASSETS/$name"
        cp "$OUT/$name/model/"* "$ASSETS/$name/"
    done
    echo "$BUILD: done in $(( ($(date +%s) - start) / 60 )) min;" \
        "models in $ASSETS/brisk-chat and $ASSETS/brisk-draft"
}

# make_seed: the seed, OUT/seed: the target's width in two layers, on copy drills only, until it
# copies from the context (an induction circuit forms around drill step 1900; eight layers from
# scratch had not formed one after 800). Three runs: the first run's schedule decayed before the
# circuit formed.
make_seed() {
    step "$OUT/seed1" python -m training.train --preset seed "${common[@]}" --out "$OUT/seed1" \
        --steps 700 --drill-frac 1.0 --lr 3e-3 --warmup 30
    step "$OUT/seed2" python -m training.train --preset seed "${common[@]}" --out "$OUT/seed2" \
        --init "$OUT/seed1/model" --steps 800 --drill-frac 1.0 --lr 2e-3 --warmup 20
    step "$OUT/seed" python -m training.train --preset seed "${common[@]}" --out "$OUT/seed" \
        --init "$OUT/seed2/model" --steps 1000 --drill-frac 1.0 --lr 2e-3 --warmup 20 \
        --min-lr-ratio 0.5
}

# make_draft: the draft, OUT/brisk-draft (two narrow layers): copy drills first, then easy samples,
# then the full mix of the first set.
make_draft() {
    step "$OUT/brisk-draft" python -m training.train --preset draft "${common[@]}" \
        --out "$OUT/brisk-draft" --steps 2000 --drill-steps 500 --easy-steps 300 --drill-frac 0.1 \
        --lr 3e-3 --warmup 50
}
