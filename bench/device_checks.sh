#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one pass, for a session that is lent one (first run in
# session 44, on an H200: every GPU test passed but the xformers cases): the GPU-marked tests (int4 kernels, sampling, grammar masks, SDPA and xformers against the
# reference, model parity with transformers in float32 and bfloat16, the engine end to end, CUDA
# graphs against eager passes) and the engine-vs-transformers, chunked-prefill and large-model
# decode benchmarks on CUDA in bfloat16 (issue 2). About 5 minutes on the lent H200 (session 44:
# tests 35-90 s, each benchmark 30-70 s).
#
#   bash bench/device_checks.sh [LOG_DIR]      # from the repository root; logs to LOG_DIR
#
# The machine needs torch, transformers, tokenizers, safetensors, sentencepiece, jinja2, tqdm,
# numpy and pytest (the lent H200 has them) plus what brisklm adds. Where pip cannot reach PyPI,
# download those as wheels into .whl/ first (git-ignored), on a machine that can:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl llguidance pydantic pydantic-core annotated-types typing-inspection
# (xformers is optional: without it the xformers cases skip and say so; PyPI's xformers 0.0.35 was
# built for torch 2.10 and does not load on the H200's torch 2.11). This script installs
# .whl/*.whl into a scratch folder when the folder is there.
set -uo pipefail
case "${1:-}" in
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    -*) echo "device_checks.sh: unknown option $1 (the one argument is a log folder)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
logs=${1:-/tmp/brisklm-device-checks}
mkdir -p "$logs"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/brisklm-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/brisklm-site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:$PWD:${PYTHONPATH:-}
status=0
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$logs/machine.txt"
# Only these files hold GPU-marked tests; naming them keeps collection off test modules whose
# imports (langchain, jsonschema, ...) a bare GPU machine lacks.
python3 -m pytest -q -m gpu -rs -p no:cacheprovider \
    tests/quant/test_int4_linear.py tests/sampling/test_sampling_sampler.py \
    tests/constrained/test_apply.py tests/models/test_attention_backends.py \
    tests/models/test_parity.py tests/engine/test_cuda.py tests/engine/test_decode_graphs.py \
    2>&1 | tee "$logs/gpu_tests.log" || status=1
python3 bench/engine_vs_transformers.py --device cuda --dtype bfloat16 --repeats 5 2>&1 \
    | tee "$logs/engine_vs_transformers_cuda_bf16.log" || status=1
python3 bench/chunked_prefill.py --device cuda --dtype bfloat16 --chunk 1024 --preset 245m 2>&1 \
    | tee "$logs/chunked_prefill_cuda_bf16.log" || status=1
python3 bench/large_model_decode.py 2>&1 | tee "$logs/large_model_decode_cuda_bf16.log" || status=1
# At 4,000 positions: what the graphs' per-layer key copy and masked attention cost (not yet measured).
python3 bench/large_model_decode.py --prompt-len 4000 --no-transformers 2>&1 \
    | tee "$logs/large_model_decode_4k_cuda_bf16.log" || status=1
echo "device checks: logs in $logs (status $status)"
exit $status
