"""The aarch64 lane's own pieces (the lane itself runs in CI after the suite: scripts/arm64/
lane.sh): the board's install block it reads from docs/jetson.md, and the verdicts of its
comparison of two machines' answers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "arm64"))

from compare import MIN_OPUS_SNR_DB, compare  # noqa: E402
from doc_block import block  # noqa: E402

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")


def extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def requirements_of(names: list[str]) -> set[str]:
    """The distributions the named extras bring, through extras that name other extras."""
    found, todo = set(), list(names)
    while todo:
        for req in extras()[todo.pop()]:
            name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()
            inner = re.match(r"personaplex-edge\[([^\]]+)\]", req)
            if inner:
                todo += inner.group(1).split(",")
            else:
                found.add(name)
    return found


def test_the_lane_installs_the_tools_it_calls_before_it_calls_them():
    """Step 1 installs the Debian package of every tool the lane runs on the x86-64 side, so a
    bare machine (a container without curl or procps) runs it as CI does."""
    text = (ROOT / "scripts" / "arm64" / "lane.sh").read_text()
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    listed = re.search(r"^for pkg in ([^;]+); do$", code, re.M)
    installed = listed.group(1).split()
    code = code[listed.end():]  # what runs after the list
    first_use = code.index("apt-get install")
    for tool, package in {"curl": "curl", "pgrep": "procps", "debootstrap": "debootstrap",
                          "update-binfmts": "binfmt-support"}.items():
        uses = [m.start() for m in re.finditer(rf"(?<![\w-]){tool}(?![\w-])", code)]
        assert uses, tool
        assert package in installed and min(uses) > first_use, (tool, package)


def test_the_board_block_installs_the_runtime_and_the_server_without_torch_or_rust():
    lines = block((ROOT / "docs" / "jetson.md").read_text(), "board-install")
    apt = next(line for line in lines if "apt-get install" in line).split()
    assert {"libopus0", "libspeexdsp1", "libportaudio2", "python3-venv"} <= set(apt)
    pip = next(line for line in lines if "pip install -e" in line)
    named = re.search(r'"\.\[([^\]]+)\]"', pip).group(1).split(",")
    assert {"jetson", "cpu", "audio", "serve", "webrtc", "assistant"} == set(named)
    brought = requirements_of(named)
    assert {"onnxruntime", "aiohttp", "sounddevice", "cuda-python", "webrtcvad-wheels",
            "aiortc", "av"} <= brought
    # torch is the export's; sphn has no aarch64 wheel (pip would build it with Rust)
    assert not brought & {"torch", "sphn", "onnxruntime-gpu"}
    # silero-vad's own requirements are torch and torchaudio: only its model file is wanted
    silero = next(line for line in lines if "silero-vad" in line)
    assert "--no-deps" in silero.split()


def test_a_missing_block_is_named():
    with pytest.raises(SystemExit, match="arm64-lane: nowhere"):
        block("# a page\n```bash\nls\n```\n", "nowhere")


def write(d: Path, name: str, pcm: np.ndarray, text: str | None) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.pcm16").write_bytes(pcm.astype("<i2").tobytes())
    if text is not None:
        (d / f"{name}.txt").write_text(text)


def verdicts(tmp_path: Path, name: str, x86: np.ndarray, arm: np.ndarray, text_x86="hi there",
             text_arm="hi there") -> dict:
    a, b = tmp_path / "x86", tmp_path / "arm64"
    write(a, name, x86, text_x86)
    write(b, name, arm, text_arm)
    (row,) = compare(a, b)
    return row


@pytest.fixture
def answer():
    return (np.random.default_rng(0).standard_normal(4800) * 3000).astype(np.int16)


def test_one_lsb_apart_passes_two_fail(tmp_path, answer):
    assert verdicts(tmp_path / "1", "run-greedy", answer, answer + 1)["ok"]
    row = verdicts(tmp_path / "2", "run-greedy", answer, answer + np.int16(2) * (answer > 0))
    assert not row["ok"] and row["max_lsb"] == 2 and row["why"] == "samples differ"


def test_text_must_be_identical(tmp_path, answer):
    row = verdicts(tmp_path, "stdio", answer, answer, text_arm="hi here")
    assert not row["ok"] and row["why"] == "text differs"


def test_an_opus_answer_is_judged_by_its_snr(tmp_path, answer):
    """/api/chat's answer: another encoding of the same signal passes, the same one shifted
    by one Opus packet does not (nor would it at 1 LSB)."""
    noise = (np.random.default_rng(1).standard_normal(4800) * 300).astype(np.int16)  # 20 dB
    assert verdicts(tmp_path / "a", "chat", answer, answer + noise)["ok"]
    shifted = np.roll(answer, 960)
    row = verdicts(tmp_path / "b", "chat", answer, shifted)
    assert not row["ok"] and row["snr_db"] < MIN_OPUS_SNR_DB
    assert not verdicts(tmp_path / "c", "run-greedy", answer, answer + noise)["ok"]


def test_a_missing_or_empty_answer_fails(tmp_path, answer):
    a, b = tmp_path / "x86", tmp_path / "arm64"
    write(a, "api", answer, "hello")
    b.mkdir()
    assert compare(a, b) == [{"question": "api", "ok": False, "why": "no answer"}]
    row = verdicts(tmp_path / "e", "api", answer, answer, text_x86="", text_arm="")
    assert not row["ok"] and row["why"] == "empty"


def test_the_command_exits_1_on_any_failure(tmp_path, answer):
    a, b = tmp_path / "x86", tmp_path / "arm64"
    write(a, "run-greedy", answer, "x")
    write(b, "run-greedy", answer, "x")
    write(a, "opus-decode", answer, None)
    write(b, "opus-decode", answer, None)
    script = ROOT / "scripts" / "arm64" / "compare.py"
    ok = subprocess.run([sys.executable, str(script), str(a), str(b)], capture_output=True,
                        text=True)
    assert ok.returncode == 0 and ok.stdout.count(" ok") == 2, ok.stdout
    write(b, "opus-decode", answer + 5, None)
    bad = subprocess.run([sys.executable, str(script), str(a), str(b)], capture_output=True,
                         text=True)
    assert bad.returncode == 1 and "FAIL: samples differ" in bad.stdout
