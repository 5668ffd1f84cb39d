"""Models by id: `--model OWNER/NAME[@REVISION]` through huggingface_hub's real code, its HTTP
replaced at the lowest seam by a hub in memory (tests/fake_hub.py), or offline from a cache laid
out as the library lays out a download."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dir_state import tree_state

from personaplex_edge import manifest as manifest_mod
from personaplex_edge.cli import main
from personaplex_edge.errors import ModelDirError
from personaplex_edge.model_ref import resolve_model

HELLO = Path(__file__).resolve().parents[1] / "personaplex_edge" / "data" / "hello.wav"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def hub_cache_of(model_dir: Path, hub_cache: Path, repo: str, commit: str) -> Path:
    """`model_dir` as huggingface_hub stores a download of `repo` at `commit`: the content in
    blobs/<hash>, snapshots/<commit>/<path> relative symlinks to them, refs/main naming the
    commit. Returns the snapshot."""
    root = hub_cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / commit
    for rel, data in _files(model_dir).items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    return snapshot


def _codes(args: list[str], out: Path) -> np.ndarray:
    assert main(["codec", *args, "--input", str(HELLO), "--codes-out", str(out)]) == 0
    return np.load(out)


def test_a_cached_model_runs_by_id_offline_as_its_directory_and_its_snapshot_is_untouched(
        tiny_codec_dir, tmp_path):
    hub_cache = tmp_path / "hf" / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    hub_cache_of(tiny_codec_dir, hub_cache, "someone/tiny-codec", commit)
    repo_folder = hub_cache / "models--someone--tiny-codec"
    before = tree_state(repo_folder)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
               HF_HUB_CACHE=str(hub_cache), PERSONAPLEX_CACHE=str(tmp_path / "user-cache"))

    def codec(model: str, out: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "personaplex_edge.cli", "codec", "--model",
                               model, "--input", str(HELLO), "--codes-out", str(out)],
                              env=env, capture_output=True, text=True, timeout=120)

    by_dir = _codes(["--model", str(tiny_codec_dir)], tmp_path / "dir.npy")
    for run in (1, 2):  # the second start finds the hashes stamped
        done = codec("someone/tiny-codec", tmp_path / f"id{run}.npy")
        assert done.returncode == 0, done.stderr
        np.testing.assert_array_equal(np.load(tmp_path / f"id{run}.npy"), by_dir)
    assert tree_state(repo_folder) == before  # nothing written into (or beside) the snapshot
    assert list((tmp_path / "user-cache" / "verified").glob("*.json"))  # the stamp went here

    done = codec("someone/not-cached", tmp_path / "x.npy")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "someone/not-cached" in done.stderr and "HF_HUB_OFFLINE" in done.stderr
    assert not (hub_cache / "models--someone--not-cached" / "snapshots").exists()


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The hub in memory, empty caches of this test's own, and no token."""
    import fake_hub

    return fake_hub.FakeHub.for_test(monkeypatch, tmp_path)


def test_fetched_by_id_then_a_second_start_downloads_and_hashes_nothing(hub, tiny_codec_dir,
                                                                        tmp_path, monkeypatch):
    commit = hub.publish_dir("someone/tiny-codec", tiny_codec_dir)
    said = []
    path = resolve_model("someone/tiny-codec", said.append)
    assert path.name == commit and _files(path) == _files(tiny_codec_dir)
    assert any("fetching someone/tiny-codec" in line for line in said)
    fetched = hub.downloads()
    assert sorted(Path(p).name for p in fetched) == sorted(_files(tiny_codec_dir))

    def no_hashing(p):
        raise AssertionError(f"{p} hashed again")

    with monkeypatch.context() as m:
        m.setattr(manifest_mod, "sha256_file", no_hashing)
        assert resolve_model("someone/tiny-codec") == path
        assert resolve_model(f"someone/tiny-codec@{commit}") == path
        assert hub.downloads() == fetched  # metadata asked, nothing downloaded
        by_id = _codes(["--model", "someone/tiny-codec"], tmp_path / "id.npy")
    np.testing.assert_array_equal(by_id, _codes(["--model", str(tiny_codec_dir)],
                                                tmp_path / "dir.npy"))


def _fails(spec: str, capsys) -> str:
    assert main(["codec", "--model", spec, "--input", str(HELLO), "--codes-out", "x.npy"]) == 2
    err = capsys.readouterr().err
    *progress, last = err.splitlines()  # progress lines, then the error on one line
    assert last.startswith("personaplex-edge: error: ") and "Traceback" not in err, err
    assert not [line for line in progress if "error" in line], err
    return last


def test_each_failure_is_one_message_naming_it_and_what_to_do(hub, tiny_codec_dir, capsys,
                                                              monkeypatch, tmp_path):
    hub.publish_dir("nvidia/gated-model", tiny_codec_dir, gated=True)
    err = _fails("nvidia/gated-model", capsys)
    assert "nvidia/gated-model is gated" in err and "HF_TOKEN" in err

    err = _fails("nobody/nothing", capsys)
    assert "nobody/nothing is neither a model directory here nor a repository" in err

    hub.publish_dir("someone/tiny-codec", tiny_codec_dir)
    err = _fails("someone/tiny-codec@v9", capsys)
    assert "has no revision 'v9'" in err

    # a checkpoint, not an export: known from its missing manifest, its weights never fetched
    ckpt = tiny_codec_dir.parent / "ckpt-like"
    ckpt.mkdir(exist_ok=True)
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"\0" * 4096)
    hub.publish_dir("nvidia/a-checkpoint", ckpt)
    err = _fails("nvidia/a-checkpoint", capsys)
    assert "is not an exported personaplex-edge model (it has no manifest.json)" in err
    assert "export --checkpoint nvidia/a-checkpoint" in err
    assert not [p for p in hub.downloads() if "safetensors" in p]

    err = _fails("no/such/dir", capsys)  # neither a directory nor an id
    assert "model directory no/such/dir does not exist" in err
    (tmp_path / "models").mkdir()  # models/NAME with a models/ here: a path, not an id
    monkeypatch.chdir(tmp_path)
    asked = len(hub.requests)
    err = _fails("models/personaplex-7b-v1", capsys)
    assert "model directory models/personaplex-7b-v1 does not exist; export one" in err
    assert len(hub.requests) == asked


def test_a_download_that_disagrees_with_the_manifest_is_removed_and_fetched_again(
        hub, tiny_codec_dir, capsys):
    """A file damaged in transit: one message, the file gone from the cache (the snapshot no
    longer looks complete), and the next start downloads it again."""
    hub.publish_dir("someone/tiny-codec", tiny_codec_dir)
    good = hub.handle

    def damaging(request, once=[True]):
        response = good(request)
        if request.method == "GET" and request.url.path.endswith("/mimi_decoder.onnx") \
                and once and once.pop():
            data = bytearray(response.content)
            data[-10] ^= 0xFF
            return type(response)(200, headers=response.headers, content=bytes(data))
        return response

    hub.handle = damaging
    err = _fails("someone/tiny-codec", capsys)
    assert "downloaded 'mimi_decoder.onnx' does not match its sha256" in err
    assert "removed from the Hugging Face cache: run again" in err
    from huggingface_hub import constants

    (snapshot,) = (Path(constants.HF_HUB_CACHE) / "models--someone--tiny-codec" /
                   "snapshots").iterdir()
    assert not (snapshot / "mimi_decoder.onnx").exists()
    path = resolve_model("someone/tiny-codec")  # fetched again, whole this time
    assert _files(path) == _files(tiny_codec_dir)


def test_a_manifest_naming_files_outside_its_directory_is_refused(hub, tiny_codec_dir, tmp_path,
                                                                   capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    data = json.loads((tiny_codec_dir / "manifest.json").read_text())
    data["graphs"]["mimi_encoder"]["file"] = "../../../../etc/passwd"
    (bad / "manifest.json").write_text(json.dumps(data))
    hub.publish_dir("someone/escape", bad)
    err = _fails("someone/escape", capsys)
    assert "names files outside its directory" in err
    with pytest.raises(ModelDirError, match="outside its directory"):
        manifest_mod.load_model_dir(bad)
