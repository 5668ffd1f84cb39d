#!/usr/bin/env bash
# Creates .venv with everything the project, its export and its tests need, on a clean Debian
# machine with Python 3.11. Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    # libsndfile for soundfile (its wheel bundles one; this covers platforms without a wheel);
    # PortAudio for sounddevice; speexdsp for the echo canceller and libopus for the server's
    # Opus (both loaded through ctypes);
    # PulseAudio (a null sink and its monitor) for the live-audio test; chromium (headless, the
    # serve page's browser test; iproute2 brings up the loopback of the network namespace its
    # WebRTC calls run in) and openssl (its TLS test's certificate); systemd and
    # dbus-daemon (the assistant's unit checked by systemd-analyze verify and started under a
    # user manager of the test's own), espeak-ng and sox (its benchmarks' speech and music);
    # nginx (the manual's fleet recipe, run by a test in front of two servers: the binary
    # only, see below); libogg (an Ogg writer the server's reader is tested against) and
    # node (stdio's client in another language); libvulkan1, the Vulkan loader WebGPU runs
    # through (its device in CI is SwiftShader, the software Vulkan driver chromium ships). In
    # CI a test that skips for one of these fails (tests/ci_parts.py).
    missing=""
    for pkg in libsndfile1 libportaudio2 libspeexdsp1 libopus0 libogg0 pulseaudio \
               pulseaudio-utils libasound2-plugins chromium iproute2 openssl systemd dbus-daemon \
               espeak-ng sox nginx nodejs libvulkan1; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
    done
    # npm (OpenAI's browser Agents SDK for the WebRTC test, below): Debian packs it apart from
    # nodejs; a node that brings its own npm needs none
    command -v npm >/dev/null 2>&1 || missing="$missing npm"
    if [ -n "$missing" ]; then
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
        # installed here for the test only: the service Debian starts with it (port 80) is not
        # wanted (an nginx that was there before is left as it was)
        case " $missing " in *" nginx "*)
            if command -v systemctl >/dev/null 2>&1; then systemctl disable --now nginx || true; fi ;;
        esac
    fi
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU build of torch: a plain `torch` from PyPI is a multi-GB CUDA build on Linux x86_64.
# PyTorch's CPU wheel index comes first where it can be reached; it is probed with a short
# timeout and skipped where it cannot (a machine that reaches only PyPI, or a mirror of it,
# finds the CPU wheel there), so no install waits on an unreachable index.
TORCH="torch==2.13.0"
CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
if python - "$CPU_INDEX" <<'PY'
import sys
import urllib.request

try:
    urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=5).close()
except Exception:
    sys.exit(1)
PY
then
    echo "torch: the CPU build from $CPU_INDEX"
    python -m pip install -q --index-url "$CPU_INDEX" --extra-index-url https://pypi.org/simple \
        --timeout 60 "$TORCH"
else
    echo "torch: $CPU_INDEX cannot be reached; installing $TORCH from the configured index"
    python -m pip install -q "$TORCH"
fi
# The runtime with onnxruntime for the CPU (the `cpu` extra: never beside onnxruntime-gpu),
# the export, the tests (and mkdocs-material, which builds the manual under docs/), the sound
# devices, the server with its WebRTC calls, the assistant, and TensorRT for RTX (the `rtx`
# extra: its builder needs no GPU, so the tests build real engines of every graph), and
# onnxruntime's WebGPU provider (the `webgpu` extra: the tests run it on SwiftShader).
python -m pip install -q -e ".[cpu,export,dev,audio,serve,webrtc,assistant,rtx,webgpu]"
# The test reference. It pins torch<2.10, so it goes in without its dependencies (the light
# ones are in the dev extra).
python -m pip install -q --no-deps "moshi==0.2.13"
# The assistant's second voice detector reads silero's ONNX model from this wheel (its own
# code imports torch, so no extra can name it): without its dependencies, as docs/assistant.md
# tells users.
python -m pip install -q --no-deps "silero-vad==6.2.3"
# OpenAI's Agents SDK for the browser (its WebRTC transport is a client the browser test
# drives against serve), where npm is: into .venv/npm, nothing global
if command -v npm >/dev/null 2>&1 && \
        [ ! -f .venv/npm/node_modules/@openai/agents-realtime/dist/bundle/openai-realtime-agents.umd.js ]; then
    npm install --silent --no-audit --no-fund --prefix .venv/npm "@openai/agents-realtime@0.20.0"
fi
# Node's libwebrtc bindings: a stock WebRTC client the calls' test runs on this machine
if command -v npm >/dev/null 2>&1 && [ ! -d .venv/npm/node_modules/@roamhq/wrtc ]; then
    npm install --silent --no-audit --no-fund --prefix .venv/npm "@roamhq/wrtc@0.10.0"
fi
echo "installed into .venv: $(python -c 'import torch, onnxruntime; print("torch", torch.__version__, "onnxruntime", onnxruntime.__version__)')"
