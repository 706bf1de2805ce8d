# Sourced by build_all.sh and build_fast.sh after they set BUILD (the script's name in messages),
# start (its start time in seconds) and common (every training run's flags).
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
