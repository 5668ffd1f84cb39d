#!/usr/bin/env bash
# onnxruntime-gpu's CUDA provider on an offline GPU machine (no network; a python3 with torch
# for CUDA 13, whose nvidia-* wheels carry the libraries onnxruntime-gpu 1.31.1 needs: cudart
# 13, cuBLAS 13, cuDNN 9, cuFFT, cuRAND), then the GPU check's onnxruntime stages: tokens of
# ort-cuda against ort-cpu, ms per frame.
#
# The wheel is 256 MB. Where files reach the machine only in small transfers (ORT_GPU_CARRY_MIB
# each, the checkout included; default 64), it travels in pieces (scripts/gpu/carry.py), and
# the 7B's fp16 graphs travel as a skeleton (below). So:
#
#   here:   bash scripts/gpu/ort_gpu_check.sh prepare   # the wheel for the machine's python,
#                                                       # cut into build/carry/ort-gpu; the
#                                                       # 7B's fp16 skeleton (below); prints
#                                                       # what each transfer takes
#   there, after each transfer:  bash scripts/gpu/ort_gpu_check.sh status  # pieces still to come
#   there, after the last:       bash scripts/gpu/ort_gpu_check.sh run     # ORT_GPU_SECONDS=S
#                                                       # bounds it to S seconds
#   here:   bash scripts/gpu/ort_gpu_check.sh rehearse  # all of it on this machine: the wheel for
#                                                       # this python, the pieces moved one at a
#                                                       # time into a scratch copy, joined,
#                                                       # unpacked, imported, the check simulated
#
# `run` joins the pieces (each and the whole checked by sha256), unpacks the wheel into its own
# folder put first on PYTHONPATH (the machine's CPU onnxruntime stays as it is: one module, two
# builds, never installed side by side), imports torch first (its CUDA libraries then resolve
# for onnxruntime's provider), checks that `import onnxruntime` is the carried build and has
# its CUDA provider, then runs scripts/gpu/gpu_check.py, most wanted first:
#   demo  the built-in demo through the public API on the GPU and on the CPU (persona prefill,
#         ms a frame, words and audio against the CPU over 60 frames)
#   7b    the 7B's fp16 graphs (the GPU recipe) made again from the skeleton: ms a frame through
#         OrtCudaGraph eager and replayed as CUDA graphs, the default persona's 82-frame prefill
#   mid, tiny   fp32, fp16 and int4 graphs: tokens of ort-cuda against ort-cpu, ms a frame
# (TensorRT is not there: its stages are skipped and say so). The report goes to $OUT when set.
#
# The skeleton: the 7B's graphs without their 15.7 GB of weights (scripts/gpu/skeleton.py), made
# here from a full-size fp16 export:
#   here:   bash scripts/gpu/ort_gpu_check.sh skeleton  # a random 7B checkpoint in the published
#                                                       # layout, its fp16 GPU graphs, their
#                                                       # skeleton; the rest deleted (~5 min,
#                                                       # ~33 GB of disk meanwhile)
# or `prepare` with ORT_GPU_7B naming an fp16 export made by
#   personaplex-edge export --checkpoint CKPT --out DIR --precision fp16 --backend tensorrt --no-engines
set -u
cd "$(dirname "$0")/../.."
VERSION=${ORT_GPU_VERSION:-1.31.1}
PY=${ORT_GPU_PYTHON:-3.12} # the GPU machine's python (major.minor): the wheel is built per version
CARRY_MIB=${ORT_GPU_CARRY_MIB:-64}  # the most one transfer to the machine takes
PIECES=${ORT_GPU_PIECES:-build/carry/ort-gpu}
SKELETON=${ORT_GPU_SKELETON:-build/carry/7b-skeleton}
WORK=${ORT_GPU_WORK:-/tmp/ort-gpu}
START=$(date +%s)
say() { echo "[ort-gpu $(($(date +%s) - START))s] $*"; }

wheel_name() { # the file pip downloads for python $1
    echo "onnxruntime_gpu-$VERSION-cp${1/./}-cp${1/./}-manylinux_2_28_x86_64.whl"
}

prepare() { # prepare PYTHON_VERSION: download and cut
    local py=$1 name
    name=$(wheel_name "$py")
    mkdir -p build/carry/wheels
    if [ ! -f "build/carry/wheels/$name" ]; then
        say "downloading $name"
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
            --platform manylinux_2_28_x86_64 -d build/carry/wheels "onnxruntime-gpu==$VERSION" ||
            return 1
    fi
    if [ -n "${ORT_GPU_7B:-}" ]; then
        python3 scripts/gpu/skeleton.py make "$ORT_GPU_7B" "$SKELETON" || return 1
    elif [ ! -f "$SKELETON/skeleton.json" ]; then
        say "no 7B skeleton at $SKELETON (bash scripts/gpu/ort_gpu_check.sh skeleton makes one): the 7b stages will skip"
    fi
    # what else travels with each transfer: the tracked and untracked files git does not
    # ignore, and with the first piece the skeleton
    local tree_mib skeleton_mib piece_mib
    tree_mib=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null |
        tail -1 | awk '{printf "%.1f", $1 / 1048576}')
    skeleton_mib=$(du -cb "$SKELETON" 2>/dev/null | tail -1 | awk '{printf "%.1f", $1 / 1048576}')
    piece_mib=$(awk -v c="$CARRY_MIB" -v t="$tree_mib" -v k="${skeleton_mib:-0}" \
        'BEGIN {printf "%.1f", c - t - k - 1}')
    rm -rf "$PIECES"
    python3 scripts/gpu/carry.py split "build/carry/wheels/$name" "$PIECES" --piece-mib "$piece_mib"
    say "the working tree is $tree_mib MiB, the skeleton ${skeleton_mib:-0} MiB: pieces of at most $piece_mib MiB"
    local n=0 part
    for part in "$PIECES/$name".part-*; do
        extra=""
        [ $n = 0 ] && extra="$PIECES/$name.pieces.json, "
        [ $n = 0 ] && [ -d "$SKELETON" ] && extra="$extra$SKELETON, "
        echo "  transfer $((n + 1)): the checkout with [$extra$part]"
        n=$((n + 1))
    done
    echo "  after each: bash scripts/gpu/ort_gpu_check.sh status; after the last:"
    echo "  bash scripts/gpu/ort_gpu_check.sh run (ORT_GPU_SECONDS=S: done within S seconds)"
}

unpack() { # unpack PYTHON_VERSION: join the pieces and unpack the wheel into $WORK/site
    local name
    name=$(wheel_name "$1")
    mkdir -p "$WORK"
    python3 scripts/gpu/carry.py join "$PIECES" "$name" "$WORK/$name" || return 1
    rm -rf "$WORK/site"
    python3 -m zipfile -e "$WORK/$name" "$WORK/site" || return 1
    rm -f "$WORK/$name"
    say "onnxruntime-gpu $VERSION unpacked into $WORK/site"
}

check() { # check [gpu_check.py arguments]: the provider, then the GPU check's stages
    export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
    python3 - "$WORK/site" <<'PY' || return 1
import sys

try:
    import torch  # its CUDA 13 libraries, loaded first, serve onnxruntime's provider
    print("torch", torch.__version__, "cuda", torch.version.cuda,
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")
except ImportError:
    print("no torch")
import onnxruntime as ort

assert ort.__file__.startswith(sys.argv[1]), f"the image's onnxruntime came first: {ort.__file__}"
if hasattr(ort, "preload_dlls"):
    ort.preload_dlls()
print("onnxruntime", ort.__version__, ort.get_device(), ort.get_available_providers())
assert "CUDAExecutionProvider" in ort.get_available_providers(), "a build without CUDA"
PY
    local budget=""
    if [ -n "${ORT_GPU_SECONDS:-}" ]; then
        budget="--budget-s $((ORT_GPU_SECONDS - ($(date +%s) - START) - 15))"
        say "scripts/gpu/gpu_check.py within ${budget#--budget-s } s"
    fi
    python3 scripts/gpu/gpu_check.py --configs demo,7b,mid,tiny --skeleton "$SKELETON" \
        --precisions fp16-tensorrt,int4-onnx,fp32-tensorrt $budget "$@"
}

skeleton() ( # the 7B's fp16 skeleton from nothing, in a scratch directory deleted after
    scratch=${ORT_GPU_SCRATCH:-build/carry/7b-scratch}
    rm -rf "$scratch" && mkdir -p "$scratch"
    trap 'rm -rf "$scratch"' EXIT
    say "writing a random PersonaPlex-7B checkpoint in the published layout (16.7 GB)"
    NO_TORCH_COMPILE=1 python3 -c "
import sys
from personaplex_edge.config import PersonaPlexConfig
from personaplex_edge.export.synthetic import write_synthetic_checkpoint
write_synthetic_checkpoint(PersonaPlexConfig(), sys.argv[1], streamed=True)" "$scratch/ckpt" || return 1
    say "exporting its fp16 GPU graphs (graphs only)"
    NO_TORCH_COMPILE=1 python3 -m personaplex_edge.cli export --checkpoint "$scratch/ckpt" \
        --out "$scratch/fp16" --precision fp16 --backend tensorrt --no-engines || return 1
    python3 scripts/gpu/skeleton.py make "$scratch/fp16" "$SKELETON" || return 1
    say "skeleton in $SKELETON"
)

case "${1:-}" in
skeleton)
    [ -x .venv/bin/python3 ] && PATH=$PWD/.venv/bin:$PATH
    skeleton
    ;;
prepare)
    prepare "$PY"
    ;;
status)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
    python3 -V
    python3 scripts/gpu/carry.py check "$PIECES" "$(wheel_name "$PY")"
    ;;
run)
    shift
    unpack "$PY" && check "$@"
    ;;
rehearse)
    # this machine's python (the project's venv, which holds torch as the GPU machine's
    # python3 does), the pieces moved one at a time into a scratch copy of the tree
    [ -x .venv/bin/python3 ] && PATH=$PWD/.venv/bin:$PATH
    py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    prepare "$py" || exit 1
    name=$(wheel_name "$py")
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$scratch"
    mkdir -p "$scratch/$PIECES"
    cp "$PIECES/$name.pieces.json" "$scratch/$PIECES/"
    for part in "$PIECES/$name".part-*; do
        cp "$part" "$scratch/$PIECES/"
        (cd "$scratch" && ORT_GPU_PYTHON=$py bash scripts/gpu/ort_gpu_check.sh status | grep "pieces here")
    done
    # the skeleton's way, on the demo's graphs (a full-size one would make 15.7 GB here):
    # made, carried, filled and run on the simulated device, as the 7B is there
    demo=$(python3 -c 'from personaplex_edge.model_ref import resolve_model; print(resolve_model("demo", print))' | tail -1)
    python3 scripts/gpu/skeleton.py make "$demo" "$scratch/$SKELETON" --keep-bytes 1024 || exit 1
    cd "$scratch" && ORT_GPU_PYTHON=$py ORT_GPU_WORK=$scratch/work ORT_GPU_SECONDS=${ORT_GPU_SECONDS:-300} \
        bash scripts/gpu/ort_gpu_check.sh run --simulate --configs demo,7b,tiny
    ;;
*)
    sed -n '2,/^set -u/p' "$0" | sed '$d'  # the header
    exit 2
    ;;
esac
