#!/usr/bin/env bash
# The aarch64 lane: the project installed and run as on a Jetson, in a Debian bookworm arm64
# root run through qemu-user, every answer compared with this (x86-64) machine's.
#
#   sudo scripts/arm64/lane.sh          (CI: .ci/run, after the test suite; root is needed)
#
#   1. qemu-user-static, binfmt-support, debootstrap from apt, and the tools the lane calls on
#      this side (curl: the servers' health; pgrep, from procps: a server's processes);
#      aarch64 registered with binfmt.
#   2. The root, built once by debootstrap into $PERSONAPLEX_ARM64_CACHE (default
#      /var/cache/personaplex-edge/arm64) with the OS packages docs/jetson.md installs, and
#      reused while its recipe (this file's package list and suite) is the same; pip's cache
#      lives inside it, so a warm lane downloads nothing.
#   3. This checkout copied in (tracked and untracked files, nothing git ignores), then the
#      install lines of docs/jetson.md's board block run there as written: no torch; the
#      webrtc extra's aiortc and PyAV import and make an Opus track.
#   4. The built-in demo model exported here (x86-64, torch) into a cache, then copied into the
#      root's per-user cache, as docs/jetson.md says to move one to a board.
#   5. The same questions on both sides: `run` (greedy and seeded), `stdio`, the Python API, the
#      assistant's voice detectors, and `serve` with one client of each protocol (/api/chat,
#      /v1/realtime) sent from here.
#      compare.py: text identical, PCM16 within 1 LSB (the Opus of /api/chat: see compare.py).
#
# Mounts (/proc, /dev) live in a private mount namespace of each chroot command (unshare -m):
# they vanish when it exits, whatever happens; nothing stays mounted. /sys is not mounted: this
# machine's (x86) sysfs crashes onnxruntime's CPU probe (cpuinfo) under qemu with SIGSEGV;
# without it the probe fails softly (one warning) and onnxruntime runs its generic arm64 kernels.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
CACHE=${PERSONAPLEX_ARM64_CACHE:-/var/cache/personaplex-edge/arm64}
SUITE=bookworm
MIRROR=${PERSONAPLEX_ARM64_MIRROR:-http://deb.debian.org/debian}
ROOT=$CACHE/root
WORK=$CACHE/last-run # this run's answers, kept for a look afterwards
SRC=/src/personaplex-edge # the checkout inside the root
PORT_X86=${PERSONAPLEX_ARM64_PORT_X86:-18998}
PORT_ARM=${PERSONAPLEX_ARM64_PORT_ARM:-18999}
HOST_PY=$REPO/.venv/bin/python
T0=$(date +%s)

say() { printf '[arm64 lane %4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() { say "FAILED: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, binfmt): sudo $0"
[ -x "$HOST_PY" ] || die "no $HOST_PY: run scripts/install.sh first (the x86 side's answers)"

# -- 1. qemu-user and binfmt -----------------------------------------------------------------
missing=""
for pkg in qemu-user-static binfmt-support debootstrap curl procps; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
    say "apt-get install$missing"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >/dev/null
fi
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
# F (fix-binary): the kernel holds the interpreter open, so the root needs no copy of qemu
grep -q '^flags:.*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 ||
    die "qemu-aarch64 is registered without the F flag: update-binfmts --enable qemu-aarch64"

# -- 2. the root -------------------------------------------------------------------------------
# the OS packages of the board's install block (its apt-get line), plus what a bare root needs
BOARD=$(python3 scripts/arm64/doc_block.py docs/jetson.md board-install)
APT_LINE=$(printf '%s\n' "$BOARD" | grep -m1 'apt-get install') || die "docs/jetson.md: no apt-get line"
DOC_PACKAGES=$(printf '%s\n' "$APT_LINE" | sed 's/.*apt-get install//' | tr ' ' '\n' | grep -v '^-' | grep . | sort -u | tr '\n' ' ')
PACKAGES="ca-certificates python3 $DOC_PACKAGES"
RECIPE="$SUITE $MIRROR $PACKAGES"
if [ -f "$ROOT/.lane-recipe" ] && [ "$(cat "$ROOT/.lane-recipe")" = "$RECIPE" ]; then
    say "reusing the arm64 root $ROOT"
else
    say "building a Debian $SUITE arm64 root in $ROOT (debootstrap: a few minutes)"
    # never rm -rf through a mount (a /proc or /dev someone left there)
    ! grep -q " $ROOT" /proc/mounts || die "something is mounted under $ROOT: unmount it first"
    rm -rf "$ROOT" "$ROOT.partial"
    mkdir -p "$CACHE"
    debootstrap --arch=arm64 --variant=minbase --include="$(echo $PACKAGES | tr ' ' ',')" \
        "$SUITE" "$ROOT.partial" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
        die "debootstrap (see $CACHE/debootstrap.log)"
    echo "$RECIPE" >"$ROOT.partial/.lane-recipe"
    mv "$ROOT.partial" "$ROOT" # a root is there whole or not at all
fi

# this machine's network and pip configuration: the registries are reached through it
cp /etc/resolv.conf /etc/hosts "$ROOT/etc/"
mkdir -p "$ROOT/etc/ssl/certs" "$ROOT/etc/xdg"
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$ROOT/etc/pip.conf"
rm -rf "$ROOT/etc/xdg/pip"
[ -d /etc/xdg/pip ] && cp -r /etc/xdg/pip "$ROOT/etc/xdg/pip"
echo 'APT::Get::Assume-Yes "true";' >"$ROOT/etc/apt/apt.conf.d/90lane-assume-yes"
# the PIP_* settings of this environment; paths in them that only exist here are skipped
# by pip with a warning
PIP_ENV=()
while IFS='=' read -r name value; do
    case "$name" in PIP_*) PIP_ENV+=("$name=$value") ;; esac
done < <(env)

# in_root CMD...: CMD in the root, as root, with a clean environment and its own mounts
in_root() {
    unshare -m --propagation private -- sh -c '
        root=$1; shift
        mount -t proc proc "$root/proc"
        mount --bind /dev "$root/dev"
        mount -t tmpfs -o size=256m shm "$root/dev/shm"
        exec chroot "$root" "$@"' in_root "$ROOT" \
        env -i HOME=/root LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        "${PIP_ENV[@]}" "$@"
}
[ "$(in_root uname -m)" = aarch64 ] || die "the root does not run as aarch64"

# -- 3. the install, as docs/jetson.md says --------------------------------------------------
rm -rf "$WORK"
mkdir -p "$WORK/x86" "$WORK/arm64"
say "copying this checkout into the root ($SRC)"
rm -rf "$ROOT$SRC"
mkdir -p "$ROOT$SRC"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$ROOT$SRC"
say "installing as docs/jetson.md's board block says (pip under qemu: minutes)"
printf '%s\n' "$BOARD" | sed 's/^/    /'
{
    echo 'set -eux'
    echo 'sudo() { "$@"; }' # root in the root
    echo "cd $SRC"
    printf '%s\n' "$BOARD"
} >"$ROOT/tmp/board-install.sh"
# A download cut short by the network (pip then reports a hash mismatch or a broken read) is
# tried again, up to three times; any other failure of the install is the lane's failure.
NETWORK_FAILURE='DO NOT MATCH THE HASHES|IncompleteRead|ReadTimeoutError|ProtocolError|Connection (reset|aborted|refused)|Temporary failure in name resolution'
for try in 1 2 3; do
    if in_root bash /tmp/board-install.sh >"$WORK/install.log" 2>&1; then
        break
    fi
    if [ "$try" -lt 3 ] && grep -Eq "$NETWORK_FAILURE" "$WORK/install.log"; then
        say "the board's install failed on a download (try $try of 3): trying again"
        grep -E "$NETWORK_FAILURE" "$WORK/install.log" | head -3 | sed 's/^/    /'
        sleep 10
        continue
    fi
    tail -30 "$WORK/install.log"
    die "the board's install (see $WORK/install.log)"
done
in_root "$SRC/.venv/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is not None)' ||
    die "torch is importable in the root: the board's install must not need it"
say "installed: $(in_root "$SRC/.venv/bin/python" -c 'import platform, onnxruntime; print(platform.machine(), "Python", platform.python_version(), "onnxruntime", onnxruntime.__version__)' 2>/dev/null)"
# serve's WebRTC calls: aiortc and PyAV from their aarch64 wheels, and the server's call path
# imported as a call imports it (an Opus track's codec made and one packet through it)
in_root "$SRC/.venv/bin/python" -c '
import aiortc, av
from personaplex_edge.runtime.serve.webrtc import call, media
track = media.AnswerTrack(24000)
print("webrtc: aiortc", aiortc.__version__, "av", av.__version__)' >"$WORK/webrtc.log" 2>&1 ||
    { cat "$WORK/webrtc.log"; die "the webrtc extra does not import on the board"; }
say "$(tail -1 "$WORK/webrtc.log")"

# -- 4. the demo model, exported here and moved to the "board" -------------------------------
say "exporting the built-in demo model on x86-64"
PERSONAPLEX_CACHE=$WORK/x86-cache "$HOST_PY" -c 'from personaplex_edge.model_ref import resolve_model; resolve_model("demo")' >/dev/null
rm -rf "$ROOT/root/.cache/personaplex-edge"
mkdir -p "$ROOT/root/.cache/personaplex-edge/models"
cp -r "$WORK/x86-cache/models/demo" "$ROOT/root/.cache/personaplex-edge/models/demo"

# -- 5. the same questions on both sides -------------------------------------------------------
say "x86-64: run, stdio, the Python API, Opus, the voice detectors"
PERSONAPLEX_CACHE=$WORK/x86-cache "$HOST_PY" scripts/arm64/answers.py local "$WORK/x86" \
    2>"$WORK/local-x86.log" || { tail -20 "$WORK/local-x86.log"; die "x86-64 answers"; }
say "arm64: run, stdio, the Python API, Opus (decoding the x86 stream), the voice detectors"
rm -rf "$ROOT/tmp/answers"
mkdir -p "$ROOT/tmp/answers"
cp "$WORK/x86/opus-encode.ogg" "$ROOT/tmp/answers/x86.ogg"
in_root "$SRC/.venv/bin/python" "$SRC/scripts/arm64/answers.py" local /tmp/answers /tmp/answers/x86.ogg \
    2>"$WORK/local-arm64.log" || { tail -20 "$WORK/local-arm64.log"; die "arm64 answers"; }
cp "$ROOT"/tmp/answers/*.pcm16 "$ROOT"/tmp/answers/*.txt "$WORK/arm64/"

SERVE_FLAGS=(serve --model demo --greedy --max-backlog-frames 100000)
server_pid=""
tree() { # tree PID: PID and every process below it, children first
    local child
    for child in $(pgrep -P "$1"); do tree "$child"; done
    echo "$1"
}
alive() { # alive PID...: whether any of them still runs
    local pid
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 0; done
    return 1
}
stop_server() {
    # the arm64 server runs under the background subshell and unshare: Ctrl-C goes to every
    # process of that tree, or the server would outlive them on its port
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        local pids
        pids=$(tree "$server_pid")
        kill -INT $pids 2>/dev/null || true
        for _ in $(seq 100); do alive $pids || break; sleep 0.2; done
        kill -KILL $pids 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    server_pid=""
}
trap stop_server EXIT
serve_clients() { # serve_clients SIDE PORT: the two clients against a server on PORT
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$2/api/health" >/dev/null && break
        kill -0 "$server_pid" 2>/dev/null || die "the $1 server exited (see $WORK/serve-$1.log)"
        sleep 0.5
    done
    "$HOST_PY" scripts/arm64/answers.py serve "http://127.0.0.1:$2/" "$WORK/$1"
}
say "x86-64: serve, /api/chat and /v1/realtime clients"
PERSONAPLEX_CACHE=$WORK/x86-cache "$REPO/.venv/bin/personaplex-edge" "${SERVE_FLAGS[@]}" --port "$PORT_X86" \
    >"$WORK/serve-x86.log" 2>&1 &
server_pid=$!
serve_clients x86 "$PORT_X86"
stop_server
say "arm64: serve in the root, the same clients from here"
in_root "$SRC/.venv/bin/personaplex-edge" "${SERVE_FLAGS[@]}" --port "$PORT_ARM" >"$WORK/serve-arm64.log" 2>&1 &
server_pid=$!
serve_clients arm64 "$PORT_ARM"
stop_server

say "comparing"
"$HOST_PY" scripts/arm64/compare.py "$WORK/x86" "$WORK/arm64" | tee "$WORK/compare.txt"
say "passed in $(($(date +%s) - T0)) s"
