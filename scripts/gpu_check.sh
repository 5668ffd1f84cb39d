#!/usr/bin/env bash
# The prepared GPU check, one command on a GPU machine with PyPI access (about 10 minutes on an
# H200 with 16 cores):
#
#     bash scripts/gpu_check.sh            [extra arguments for scripts/gpu_check.py]
#
# It makes its own virtual environment ($GPU_CHECK_VENV, default /tmp/personaplex-gpu-venv,
# reused on a second run), installs what the check needs for this machine's CUDA, then runs
# scripts/gpu_check.py with the time that is left (GPU_CHECK_SECONDS in all, default 570).
# Nothing stops it: a failed install or stage is reported and the rest goes on. The report is
# printed (and written to $OUT/gpu_check.json when $OUT is set).
#
# What it installs and why:
#   torch (export only)  the CPU wheel from PyTorch's index when that is reachable (200 MB);
#                        else PyPI's default build (CUDA, ~2.5 GB with its libraries)
#   onnxruntime-gpu      the newest for CUDA >= 13 drivers, 1.25.1 (the last CUDA 12 build)
#                        otherwise; with its CUDA and cuDNN wheels; it replaces onnxruntime
#   cuda-python          the major version of the driver's CUDA (device buffers, copies, graphs)
#   tensorrt-cuXX        PyPI only holds stubs that download TensorRT's libraries from
#                        pypi.nvidia.com: where that is unreachable the TensorRT stages are
#                        skipped (reported); onnxruntime's CUDA provider still runs
set -u
cd "$(dirname "$0")/.."
START=$(date +%s)
TOTAL=${GPU_CHECK_SECONDS:-570}  # the whole check, installs included
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

reachable() {  # reachable URL: answers within 5 s (the machine may only reach PyPI)
    python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" \
        "$1" >/dev/null 2>&1
}

PYTHON=${PYTHON:-python3}
VENV=${GPU_CHECK_VENV:-/tmp/personaplex-gpu-venv}  # outside the repository
[ -x "$VENV/bin/python" ] || step "virtual environment $VENV" "$PYTHON" -m venv "$VENV"
. "$VENV/bin/activate"
PIP="python -m pip install -q --disable-pip-version-check --timeout 30 --retries 2"
step "pip" $PIP --upgrade pip

if ! python -c "import torch" 2>/dev/null; then
    if reachable https://download.pytorch.org/whl/cpu/; then
        step "torch (CPU wheel, PyTorch index)" $PIP "torch==2.13.0" \
            --index-url https://download.pytorch.org/whl/cpu
    fi
    python -c "import torch" 2>/dev/null || step "torch (PyPI)" $PIP "torch==2.13.0" \
        || step "torch (PyPI, any version)" $PIP torch
fi
# the project without its onnxruntime requirement: onnxruntime-gpu provides the same module
step "personaplex-edge" $PIP --no-deps -e .
step "project dependencies" $PIP numpy soundfile soxr sentencepiece "onnx>=1.16" \
    "safetensors>=0.4" huggingface_hub ml_dtypes
if [ "$CUDA_MAJOR" -ge 13 ]; then ORT="onnxruntime-gpu[cuda,cudnn]"; else
    ORT="onnxruntime-gpu[cuda,cudnn]==1.25.1"; fi
python -m pip uninstall -q -y onnxruntime >/dev/null 2>&1
step "$ORT" $PIP "$ORT" || step "onnxruntime-gpu (no extras)" $PIP onnxruntime-gpu
step "cuda-python $CUDA_MAJOR.x" $PIP "cuda-python>=$CUDA_MAJOR.0,<$((CUDA_MAJOR + 1)).0"
if python -c "import tensorrt" 2>/dev/null; then
    say "[ok] tensorrt already installed"
elif reachable https://pypi.nvidia.com/; then
    step "tensorrt-cu$CUDA_MAJOR (pypi.nvidia.com)" $PIP "tensorrt-cu$CUDA_MAJOR" \
        --extra-index-url https://pypi.nvidia.com \
        || say "    TensorRT did not install: the TensorRT stages will be skipped"
else
    say "[skipped] tensorrt: its libraries are only on pypi.nvidia.com, which this machine" \
        "cannot reach; the TensorRT stages will be skipped (onnxruntime CUDA still runs)"
fi
python -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())" \
    || say "onnxruntime does not import"

LEFT=$(( TOTAL - ($(date +%s) - START) ))
say "# installs done after $(( $(date +%s) - START )) s; $LEFT s left for the check"
python scripts/gpu_check.py --budget-s $(( LEFT > 60 ? LEFT - 20 : 40 )) "$@"
say "# gpu_check.sh finished after $(( $(date +%s) - START )) s"
