#!/usr/bin/env bash
# Creates .venv with everything the project, its export and its tests need, on a clean Debian
# machine with Python 3.11. Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    # libsndfile for soundfile (its wheel bundles one; this covers platforms without a wheel);
    # PortAudio for sounddevice; PulseAudio (a null sink and its monitor) for the live-audio test
    missing=""
    for pkg in libsndfile1 libportaudio2 pulseaudio pulseaudio-utils libasound2-plugins; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
    done
    if [ -n "$missing" ]; then
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
    fi
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU build of torch; a plain `torch` requirement would pull a multi-GB CUDA build.
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[export,dev,audio]"
# The test reference. It pins torch<2.10, so it goes in without its dependencies (the light
# ones are in the dev extra).
python -m pip install -q --no-deps "moshi==0.2.13"
echo "installed into .venv: $(python -c 'import torch, onnxruntime; print("torch", torch.__version__, "onnxruntime", onnxruntime.__version__)')"
