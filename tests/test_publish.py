"""`export --push-to-hub`: what huggingface_hub's real upload code sends, read on the hub's side
of its lowest HTTP seam (tests/fake_hub.py): the files, through LFS where the hub asks for it,
the model card, the repository's visibility; and the refusal before an export without a
token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from personaplex_edge.cli import main
from personaplex_edge.manifest import MANIFEST, expected_files, load_model_dir


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The hub in memory, empty caches of this test's own, and no token."""
    import fake_hub

    return fake_hub.FakeHub.for_test(monkeypatch, tmp_path)


def test_export_push_to_hub_uploads_every_file_and_the_card(hub, tiny_codec_checkpoint, tmp_path,
                                                            monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_writetoken")
    out = tmp_path / "export"
    assert main(["export", "--checkpoint", str(tiny_codec_checkpoint), "--out", str(out),
                 "--codec-only", "--push-to-hub", "someone/tiny-codec", "--private"]) == 0
    assert "published: https://huggingface.co/someone/tiny-codec/commit/" in \
        capsys.readouterr().out
    repo = hub.repos["someone/tiny-codec"]
    (created,) = hub.created
    assert (created["organization"], created["name"], created["visibility"]) == (
        "someone", "tiny-codec", "private")
    (commit_oid, sent), = repo.commits
    manifest = load_model_dir(out)
    names = set(expected_files(manifest)) | {MANIFEST, "README.md"}
    assert set(sent) == names
    assert all(sent[n] == (out / n).read_bytes() for n in names)  # byte for byte
    # the graphs went through LFS (PUT to the URL the batch endpoint gave), as large files do
    puts = [path for method, path in hub.requests if method == "PUT"]
    assert len(puts) == len([n for n in names if len(sent[n]) >= 1024]) >= 2
    assert "personaplex-edge" in repo.messages[0] and "fp32 export of" in repo.messages[0]

    card = sent["README.md"].decode()
    front = card.split("---")[1]
    assert "license: other" in front and "license_name: nvidia-open-model-license" in front
    assert "NVIDIA Open Model License" in card
    assert str(tiny_codec_checkpoint) in card and "a local directory" in card
    assert "| precision | fp32 |" in card and "| batch | 1 conversation(s)" in card
    assert f"| personaplex-edge | {manifest.package_version} |" in card
    for name, entry in manifest.graphs.items():  # the figures the export measured
        floats = {k: v for k, v in entry.check["outputs"].items() if k != "codes"}
        worst = max(floats, key=floats.get)
        assert f"| {name} | fp32 | full, 3 calls: largest difference " \
               f"{floats[worst]:.2g} ({worst})" in card
    assert "codes equal" in card
    assert "personaplex-edge run --model someone/tiny-codec" in card


def test_push_without_a_token_is_refused_before_the_export_starts(hub, tiny_codec_checkpoint,
                                                                  tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", "--checkpoint", str(tiny_codec_checkpoint), "--out", str(out),
                 "--codec-only", "--push-to-hub", "someone/tiny-codec"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HF_TOKEN" in err and "hf auth login" in err
    assert "nothing was exported" in err
    assert not out.exists() and not hub.requests
    assert main(["export", "--checkpoint", str(tiny_codec_checkpoint), "--out", str(out),
                 "--private"]) == 2
    assert "--private goes with --push-to-hub" in capsys.readouterr().err


def test_a_failed_upload_says_the_export_is_complete_and_how_to_upload_it(
        hub, tiny_codec_dir, tmp_path, monkeypatch):
    import shutil

    from personaplex_edge.errors import PersonaPlexError
    from personaplex_edge.publish import push_model

    monkeypatch.setenv("HF_TOKEN", "hf_readonlytoken")
    model = tmp_path / "model"
    shutil.copytree(tiny_codec_dir, model)
    good = hub.handle

    def no_writes(request):  # a token without write access
        if request.url.path.startswith("/api/models/") and "/commit/" in request.url.path:
            import fake_hub

            return fake_hub._error(fake_hub._httpx_module(), 403, "Forbidden",
                                   "You don't have the rights to create a commit")
        return good(request)

    hub.handle = no_writes
    with pytest.raises(PersonaPlexError) as e:
        push_model(model, "someone/tiny-codec", progress=lambda s: None)
    message = str(e.value)
    assert f"the export in {model} is complete" in message
    assert f"'hf upload someone/tiny-codec {model}'" in message and "403" in message
    assert (model / "README.md").is_file()  # the card stays with the export
    assert json.loads((model / MANIFEST).read_text())  # and the export as it was
    assert not hub.repos["someone/tiny-codec"].commits
    assert Path(model / "README.md").read_text().startswith("---\nlicense: other")
