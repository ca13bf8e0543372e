#!/usr/bin/env bash
# The GPU checks in one command, on a machine with a CUDA GPU and the project installed:
# the gpu-marked tests (tests/test_gpu.py), then the GPU benchmarks, whose JSON goes to
# OUT_DIR (default docs/results/gpu). docs/RESULTS.md says what each number means.
#
#   bash scripts/gpu_check.sh [OUT_DIR]            # everything (about 10 minutes on an H100)
#   bash scripts/gpu_check.sh OUT_DIR tests        # only the tests
#   bash scripts/gpu_check.sh OUT_DIR bench        # only the benchmarks
#
# PYTHON names the interpreter (default: the project's .venv/bin/python, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-docs/results/gpu}
PARTS=${2:-tests bench}
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA GPU is visible to $PY (torch.cuda.is_available() is False)." \
         "Fix: run it on a GPU machine" >&2
    exit 2
fi
mkdir -p "$OUT_DIR"
failed=0
step() {  # step NAME COMMAND...: run it, keep going, remember a failure
    local name=$1; shift
    echo "== $name: $*"
    "$@" || { echo "== $name FAILED (exit $?)"; failed=1; }
}
if [[ " $PARTS " == *" tests "* ]]; then
    step tests "$PY" -m pytest -m gpu -rs -v -p no:cacheprovider tests/test_gpu.py \
        --junitxml "$OUT_DIR/gpu_tests.xml"
fi
if [[ " $PARTS " == *" bench "* ]]; then
    step staging "$PY" benchmarks/bench_staging.py --json "$OUT_DIR/staging.json"
    step resnet50 "$PY" benchmarks/bench_imagenet.py --amp bf16 --channels-last \
        --json "$OUT_DIR/resnet50_bf16_channels_last.json"
    step blstm-bf16 "$PY" benchmarks/bench_blstm.py --amp bf16 --json "$OUT_DIR/blstm_bf16.json"
    step blstm-fp32 "$PY" benchmarks/bench_blstm.py --amp none --json "$OUT_DIR/blstm_fp32.json"
    step resnet50-compile "$PY" benchmarks/bench_imagenet.py --amp bf16 --channels-last --compile \
        --json "$OUT_DIR/resnet50_bf16_channels_last_compile.json"
fi
exit $failed
