"""`export ... --push-to-hub OWNER/NAME [--private]`: a verified export published on the Hugging
Face hub, with its model card, for `--model OWNER/NAME` to fetch.

    require_token     before the export starts: no token, no hour of export for nothing
    push_model        after it: the directory read back against its manifest, README.md (the
                      card, model_card.py) written into it, the repository created if need be,
                      and the manifest's files, the manifest and the card uploaded in one go
                      (huggingface_hub's upload_folder: large files through its LFS/Xet
                      transfer, resumable by running it again)
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from . import __version__
from .atomic import write_text_atomic
from .errors import PersonaPlexError
from .hub_model import import_hub, parse_model_id
from .manifest import MANIFEST, expected_files, load_model_dir
from .model_card import model_card

CARD = "README.md"


def require_token(repo: str) -> None:
    """Refuses `repo` when it is not OWNER/NAME, or when no Hugging Face token can be found
    (HF_TOKEN, or the one 'hf auth login' saved)."""
    ref = parse_model_id(repo)
    if ref is None or ref[1] is not None:
        raise PersonaPlexError(f"--push-to-hub {repo}: give the repository as OWNER/NAME "
                               "(no @revision: it is published on main)")
    if not import_hub("--push-to-hub").get_token():
        raise PersonaPlexError(
            f"--push-to-hub {repo} needs a Hugging Face token with write access: set HF_TOKEN "
            "or run 'hf auth login'; nothing was exported")


def push_model(model_dir: str | Path, repo: str, private: bool = False,
               progress: Callable[[str], None] = print) -> str:
    """Publishes the export in `model_dir` as `repo` (module docstring); the commit's URL."""
    hub = import_hub("--push-to-hub")
    model_dir = Path(model_dir)
    manifest = load_model_dir(model_dir, progress=progress)  # every hash holds (stamped)
    write_text_atomic(model_dir / CARD, model_card(manifest, repo))
    files = sorted({MANIFEST, CARD, *expected_files(manifest)})
    size = sum((model_dir / f).stat().st_size for f in files)
    progress(f"uploading {len(files)} files ({size / 1e9:.2f} GB) to "
             f"https://huggingface.co/{repo}" + (" (private)" if private else ""))
    api = hub.HfApi(library_name="personaplex-edge", library_version=__version__)
    try:
        api.create_repo(repo, private=private, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo, folder_path=model_dir, allow_patterns=files,
            commit_message=f"personaplex-edge {__version__}: {manifest.precision} export of "
                           f"{manifest.source or 'a checkpoint'}")
    except Exception as e:  # every failure of the hub's: one message, and how to resume
        raise PersonaPlexError(
            f"the export in {model_dir} is complete, but uploading it to {repo} failed "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); upload it with "
            f"'hf upload {repo} {model_dir}'") from None
    return commit.commit_url
