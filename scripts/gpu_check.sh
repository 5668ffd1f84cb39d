#!/usr/bin/env bash
# The GPU check, one command on a machine with an NVIDIA GPU (an RTX PC, a data-centre GPU, a
# Jetson; about 10 minutes on an H200 with 16 cores):
#
#     bash scripts/gpu_check.sh            [extra arguments for scripts/gpu/gpu_check.py]
#
# It exports tiny and mid-size random models, builds their TensorRT engines, compares greedy
# tokens with onnxruntime on the CPU and prints ms per frame for each backend and precision.
# On an RTX card (GeForce RTX 30-50, RTX PRO, DGX Spark) the engines are TensorRT for RTX's
# (installed from PyPI, compiled for the card when loaded); elsewhere mainline TensorRT's - an
# RTX 20 (Turing) card too: TensorRT for RTX has no float32 matrix products there.
# GPU_CHECK_LIBRARY=rtx or =tensorrt chooses instead.
#
# It probes the network first. Without one (no PyPI: nothing can be installed) it runs the
# offline stages, scripts/gpu/gpu_bare_check.py, with the machine's own python (torch with CUDA,
# cupy, cuda-bindings, CPU onnxruntime), on the bundle made beforehand where onnx is installed
# (`python scripts/gpu/gpu_bare_check.py --prepare` -> build/gpu_bundle, copied with the tree).
# With PyPI it runs the full check below.
#
# It makes its own virtual environment ($GPU_CHECK_VENV, default /tmp/personaplex-gpu-venv,
# reused on a second run), installs what the check needs for this machine's CUDA, then runs
# scripts/gpu/gpu_check.py (GPU_CHECK_SECONDS=S: all of it within S seconds, installs included;
# stages that would not fit are skipped and say so). Nothing stops it: a failed install or stage
# is reported and the rest goes on. The report is printed (and written to $OUT/gpu_check.json
# when $OUT is set).
#
# What it installs and why:
#   torch (export only)  the CPU wheel from PyTorch's index when that is reachable (200 MB);
#                        else PyPI's default build (CUDA, ~2.5 GB with its libraries)
#   onnxruntime-gpu      the newest for CUDA >= 13 drivers, 1.26.0 otherwise (the last whose
#                        [cuda] extra pulls CUDA 12 libraries; 1.27 on need CUDA 13); with its
#                        CUDA and cuDNN wheels; it replaces onnxruntime
#   cuda-python          the major version of the driver's CUDA (device buffers, copies, graphs)
#   tensorrt-rtx-cuXX    on an RTX card: TensorRT for RTX for the driver's CUDA major version,
#                        its real libraries from PyPI (~95 MB)
#   onnxruntime-ep-webgpu  the WebGPU stages (Vulkan; ~16 MB)
#   tensorrt-cuXX        elsewhere: mainline TensorRT for the driver's CUDA major version (a
#                        plain `tensorrt` is the CUDA 13 one from TensorRT 11 on); from PyPI,
#                        with pypi.nvidia.com as an extra index where it answers. If it does not
#                        install, the TensorRT stages are skipped (reported); onnxruntime's CUDA
#                        provider still runs. On a Jetson, JetPack's own TensorRT is used (the
#                        venv sees system packages there; NVIDIA's pip wheels do not support
#                        Jetson).
set -u
cd "$(dirname "$0")/.."
START=$(date +%s)
TOTAL=${GPU_CHECK_SECONDS:-}  # the whole check within this many seconds (empty: no limit)
budget() {  # budget MARGIN: --budget-s with the seconds left less MARGIN, or nothing
    [ -n "$TOTAL" ] || return 0
    local left=$(( TOTAL - ($(date +%s) - START) - $1 ))
    echo "--budget-s $(( left > 40 ? left : 40 ))"
}
say() { echo "$@"; }
step() {  # step "name" command...: runs it, reports, never stops the script
    local name=$1; shift
    local t0=$(date +%s)
    if "$@" >/tmp/gpu_check_step.log 2>&1; then
        say "[ok] $name ($(( $(date +%s) - t0 )) s)"
        return 0
    fi
    say "[FAILED] $name ($(( $(date +%s) - t0 )) s):"
    tail -5 /tmp/gpu_check_step.log | sed 's/^/    /'
    return 1
}

say "# machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader \
    2>/dev/null || say "nvidia-smi: not available"
CUDA_MAJOR=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\)\..*/\1/p' | head -1)
CUDA_MAJOR=${CUDA_MAJOR:-12}
say "driver CUDA major version: $CUDA_MAJOR; $(nproc) CPU cores"
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
GPU_CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)
LIBRARY=${GPU_CHECK_LIBRARY:-}
if [ -z "$LIBRARY" ]; then  # TensorRT for RTX: RTX cards of its compute capabilities
    case "$GPU_CC/$GPU_NAME" in
    8.6/*RTX* | 8.9/*RTX* | 12.0/*RTX* | 12.1/*) LIBRARY=rtx ;;
    *) LIBRARY=tensorrt ;;
    esac
fi
say "TensorRT: $([ "$LIBRARY" = rtx ] && echo "TensorRT for RTX" || echo mainline)"

reachable() {  # reachable URL: answers within 5 s (the machine may only reach PyPI)
    python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" \
        "$1" >/dev/null 2>&1
}

PYTHON=${PYTHON:-python3}
BUNDLE=${GPU_BUNDLE:-build/gpu_bundle}
# GPU_CHECK_OFFLINE=1: the offline stages even where PyPI answers
if [ "${GPU_CHECK_OFFLINE:-0}" = 1 ] || ! reachable https://pypi.org/simple/pip/; then
    say "# offline (no PyPI, or GPU_CHECK_OFFLINE=1): scripts/gpu/gpu_bare_check.py"
    if [ ! -f "$BUNDLE/bundle.json" ] && "$PYTHON" -c "import onnx" 2>/dev/null; then
        step "bundle ($BUNDLE)" "$PYTHON" scripts/gpu/gpu_bare_check.py --prepare --bundle "$BUNDLE"
    fi
    "$PYTHON" scripts/gpu/gpu_bare_check.py --bundle "$BUNDLE" $(budget 10) "$@"
    rc=$?
    say "# gpu_check.sh finished after $(( $(date +%s) - START )) s"
    exit $rc
fi
VENV=${GPU_CHECK_VENV:-/tmp/personaplex-gpu-venv}  # outside the repository
JETSON=0
[ -f /etc/nv_tegra_release ] && JETSON=1
VENV_ARGS=""
[ "$JETSON" = 1 ] && VENV_ARGS="--system-site-packages"  # JetPack's tensorrt lives there
make_venv() { step "virtual environment $VENV" "$PYTHON" -m venv $VENV_ARGS "$VENV"; }
venv_ok() { "$VENV/bin/python" -m pip --version >/dev/null 2>&1; }
if ! venv_ok; then
    # a venv whose pip bootstrap failed (or was interrupted) has a python but no pip
    [ -f "$VENV/pyvenv.cfg" ] && rm -rf "$VENV"
    if ! make_venv || ! venv_ok; then
        # Debian and Ubuntu ship venv's pip bootstrap apart (python3.X-venv); what the failed
        # attempt left is removed only if it is a venv (never a directory the user named)
        [ -f "$VENV/pyvenv.cfg" ] && rm -rf "$VENV"
        PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        command -v apt-get >/dev/null && step "python$PYVER-venv (apt)" sh -c \
            "apt-get update -qq && apt-get install -y -qq python3-venv python$PYVER-venv" \
            && make_venv
    fi
fi
if venv_ok; then
    . "$VENV/bin/activate"
    PY=python
else  # last resort: the system interpreter, packages in the user's site
    say "    no virtual environment: installing into $PYTHON's user site instead"
    PY=$PYTHON
    export PIP_USER=1 PIP_BREAK_SYSTEM_PACKAGES=1
fi
PIP="$PY -m pip install -q --disable-pip-version-check --timeout 30 --retries 2"
step "pip" $PIP --upgrade pip

if ! $PY -c "import torch" 2>/dev/null; then
    if reachable https://download.pytorch.org/whl/cpu/; then
        step "torch (CPU wheel, PyTorch index)" $PIP "torch==2.13.0" \
            --index-url https://download.pytorch.org/whl/cpu
    fi
    $PY -c "import torch" 2>/dev/null || step "torch (PyPI)" $PIP "torch==2.13.0" \
        || step "torch (PyPI, any version)" $PIP torch
fi
# the project without its onnxruntime requirement: onnxruntime-gpu provides the same module
step "personaplex-edge" $PIP --no-deps -e .
step "project dependencies" $PIP numpy soundfile soxr sentencepiece "onnx>=1.16" \
    "safetensors>=0.4" huggingface_hub ml_dtypes
if [ "$CUDA_MAJOR" -ge 13 ]; then ORT_PIN=""; else ORT_PIN="==1.26.0"; fi
$PY -m pip uninstall -q -y onnxruntime >/dev/null 2>&1
step "onnxruntime-gpu[cuda,cudnn]$ORT_PIN" $PIP "onnxruntime-gpu[cuda,cudnn]$ORT_PIN" \
    || step "onnxruntime-gpu$ORT_PIN (no extras)" $PIP "onnxruntime-gpu$ORT_PIN" \
    || step "onnxruntime (CPU only: the reference and CPU stages still run)" $PIP onnxruntime
step "cuda-python $CUDA_MAJOR.x" $PIP "cuda-python>=$CUDA_MAJOR.0,<$((CUDA_MAJOR + 1)).0"
if [ "$LIBRARY" = rtx ]; then
    step "tensorrt-rtx-cu$CUDA_MAJOR" $PIP "tensorrt-rtx-cu$CUDA_MAJOR" \
        || say "    TensorRT for RTX did not install: the TensorRT stages will be skipped"
elif $PY -c "import tensorrt" 2>/dev/null; then
    say "[ok] tensorrt $($PY -c 'import tensorrt; print(tensorrt.__version__)') already installed"
elif [ "$JETSON" = 1 ]; then
    say "[skipped] tensorrt: a Jetson takes JetPack's (apt install python3-libnvinfer);" \
        "the TensorRT stages will be skipped"
else
    TRT_INDEX=""
    reachable https://pypi.nvidia.com/ && TRT_INDEX="--extra-index-url https://pypi.nvidia.com"
    step "tensorrt-cu$CUDA_MAJOR" $PIP "tensorrt-cu$CUDA_MAJOR" $TRT_INDEX \
        || say "    TensorRT did not install: the TensorRT stages will be skipped"
fi
# the WebGPU stages: the same card through Vulkan (onnxruntime's WebGPU plugin rides on the
# onnxruntime module installed above; the Vulkan loader is the system's, libvulkan1)
step "onnxruntime-ep-webgpu" $PIP "onnxruntime-ep-webgpu" \
    || say "    the WebGPU plugin did not install: the WebGPU stages will be skipped"
$PY -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())" \
    || say "onnxruntime does not import"

say "# installs done after $(( $(date +%s) - START )) s"
$PY scripts/gpu/gpu_check.py --library "$LIBRARY" $(budget 20) "$@"
say "# gpu_check.sh finished after $(( $(date +%s) - START )) s"
