"""An exported model fetched from the Hugging Face hub by its id, `OWNER/NAME[@REVISION]`.

    manifest.json  (hf_hub_download: the revision resolved to a commit)
        -> the files it names, from that same commit (snapshot_download, only those files)
        -> every file against its sha256 (load_model_dir; stamped in the per-user cache)
        -> the snapshot's path, which the runtime runs from

Everything hub-side is huggingface_hub's: its cache ($HF_HOME/hub), progress bars, HF_TOKEN and
`hf auth login`, HF_HUB_OFFLINE. A second start finds every file in that cache and its hashes
in the stamp: nothing is downloaded or hashed again. A repository that is not an exported model
is known from its missing manifest.json before anything large is fetched (a checkpoint's 16 GB
of weights, say). Nothing is written into the snapshot; a file whose hash disagrees is removed
from the cache, so that a damaged download never looks complete and the next start online
fetches it again.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from . import __version__
from .errors import ModelDirError
from .manifest import MANIFEST, HashMismatch, expected_files, load_model_dir, read_manifest

Progress = Callable[[str], None]

# OWNER/NAME as the hub spells repository ids, then an optional @revision (a branch, a tag,
# a commit, refs/pr/N)
_MODEL_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<rev>[\w./-]+))?$")


def parse_model_id(spec: str) -> tuple[str, str | None] | None:
    """(repository, revision or None) for `OWNER/NAME[@REVISION]`, else None."""
    m = _MODEL_ID.match(spec)
    return (m["repo"], m["rev"]) if m else None


def import_hub(needed_for: str = "fetching a model from the Hugging Face hub"):
    """huggingface_hub, or one message saying what needs it and how to install it."""
    try:
        import huggingface_hub
    except ImportError:
        raise ModelDirError(f"{needed_for} needs huggingface_hub: pip install "
                            "'huggingface_hub>=1.0' (a dependency of personaplex-edge; an "
                            "install made with --no-deps lacks it)") from None
    return huggingface_hub


def _hub_error(e: Exception, repo: str, where: str) -> ModelDirError:
    """huggingface_hub's error as one message naming the model and what to do."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError,
                                        LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    if isinstance(e, GatedRepoError):  # (a RepositoryNotFoundError: first)
        return ModelDirError(
            f"{repo} is gated: accept its terms on https://huggingface.co/{repo} with your "
            "account, then set HF_TOKEN to a token of that account (or run 'hf auth login')")
    if isinstance(e, RepositoryNotFoundError):
        return ModelDirError(
            f"{where} is neither a model directory here nor a repository on the Hugging Face hub "
            "(a private one needs HF_TOKEN or 'hf auth login')")
    if isinstance(e, RevisionNotFoundError):
        return ModelDirError(f"{repo} has no revision {where.partition('@')[2]!r} on the "
                             "Hugging Face hub; give a branch, tag or commit it has")
    if isinstance(e, LocalEntryNotFoundError):  # (an EntryNotFoundError: first)
        why = ("HF_HUB_OFFLINE is set" if constants.is_offline_mode()
               else "the hub cannot be reached")
        return ModelDirError(
            f"{where} is not a model directory here and not (completely) in the Hugging Face "
            f"cache {constants.HF_HUB_CACHE}, and {why}: fetch it once online (unset "
            "HF_HUB_OFFLINE), or give the path of a model directory")
    if isinstance(e, EntryNotFoundError):
        return ModelDirError(
            f"{where} is not an exported personaplex-edge model (it has no {MANIFEST}); a "
            f"checkpoint is exported with 'personaplex-edge export --checkpoint {repo} --out "
            "DIR', and published with --push-to-hub")
    return ModelDirError(f"cannot fetch {where} from the Hugging Face hub: "
                         f"{type(e).__name__}: {e}")


def evict(snapshot_file: Path) -> None:
    """Removes a file from huggingface_hub's cache: the snapshot's link and the blob it points
    at (the next download then fetches it afresh)."""
    target = snapshot_file.resolve()
    snapshot_file.unlink(missing_ok=True)
    if target != snapshot_file.absolute():
        target.unlink(missing_ok=True)


def fetch_model(repo: str, revision: str | None = None, progress: Progress = print) -> Path:
    """The local snapshot of exported model `repo` at `revision` (default: main), fetched where
    the cache lacks it and checked against its manifest's hashes (module docstring)."""
    hub = import_hub()
    where = f"{repo}@{revision}" if revision else repo
    ident = {"library_name": "personaplex-edge", "library_version": __version__}
    try:
        manifest_path = Path(hub.hf_hub_download(repo, MANIFEST, revision=revision, **ident))
    except Exception as e:  # every failure of the hub's is one message
        raise _hub_error(e, repo, where) from None
    snapshot = manifest_path.parent  # .../snapshots/<commit>
    files = expected_files(read_manifest(manifest_path)[0], manifest_path)
    missing = sorted(f for f in files if not (snapshot / f).is_file())
    if missing:
        progress(f"fetching {where} ({len(missing)} files) from the Hugging Face hub into "
                 f"{snapshot.parent.parent}")
        try:
            # the manifest's commit, not the branch: a push in between cannot mix revisions
            hub.snapshot_download(repo, revision=snapshot.name, allow_patterns=missing, **ident)
        except Exception as e:
            raise _hub_error(e, repo, where) from None
    try:
        load_model_dir(snapshot, progress=progress)
    except HashMismatch as e:
        evict(snapshot / e.file)
        raise ModelDirError(
            f"{where}: the downloaded '{e.file}' does not match its sha256 in {MANIFEST} (a "
            "damaged download, or a repository whose files were changed without its manifest); "
            "it was removed from the Hugging Face cache: run again to download it again") from None
    return snapshot

