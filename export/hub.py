"""Finding a checkpoint's files: a local directory or a Hugging Face repository.

Both give the same `CheckpointFiles`; a repository is fetched through huggingface_hub (its cache,
progress bars, HF_TOKEN and offline mode apply), file by file, only the files that are needed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from personaplex_edge.config import PersonaPlexConfig
from personaplex_edge.errors import CheckpointError

MIMI_FILE = "tokenizer-e351c8d8-checkpoint125.safetensors"
LM_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer_spm_32k_3.model"
VOICES_FILE = "voices.tgz"
CONFIG_FILE = "config.json"
DEFAULT_REPO = "nvidia/personaplex-7b-v1"

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class CheckpointFiles:
    source: str
    config: PersonaPlexConfig
    mimi: Path
    lm: Path | None = None
    tokenizer: Path | None = None
    voices: Path | None = None


def _config_from(path: Path | None) -> PersonaPlexConfig:
    if path is None or not path.is_file():
        return PersonaPlexConfig()
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e
    return PersonaPlexConfig.from_dict(data, where=str(path))


def _local(root: Path, with_lm: bool) -> CheckpointFiles:
    def opt(name: str) -> Path | None:
        return root / name if (root / name).is_file() else None

    mimi = opt(MIMI_FILE)
    if mimi is None:
        raise CheckpointError(f"{root} has no {MIMI_FILE}: a PersonaPlex checkpoint directory "
                              f"holds {MIMI_FILE}, {LM_FILE}, {TOKENIZER_FILE} and {CONFIG_FILE}")
    lm = opt(LM_FILE) if with_lm else None
    if with_lm and lm is None:
        raise CheckpointError(f"{root} has no {LM_FILE} (to export only the codec, use "
                              "--codec-only)")
    return CheckpointFiles(str(root), _config_from(opt(CONFIG_FILE)), mimi, lm,
                           opt(TOKENIZER_FILE), opt(VOICES_FILE))


def _download(repo: str, with_lm: bool) -> CheckpointFiles:
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError,
                                            LocalEntryNotFoundError, RepositoryNotFoundError)
    except ImportError as e:
        raise CheckpointError("downloading needs huggingface_hub: pip install "
                              "'personaplex-edge[export]'") from e

    def fetch(name: str, required: bool) -> Path | None:
        try:
            return Path(hf_hub_download(repo, name))
        except GatedRepoError:
            raise CheckpointError(
                f"{repo} is gated: accept its licence on its Hugging Face page, then log in "
                "('hf auth login') or set HF_TOKEN to a token of that account") from None
        except RepositoryNotFoundError:
            raise CheckpointError(f"{repo} was not found on the Hugging Face hub (or it is "
                                  "private and no token was given; set HF_TOKEN)") from None
        except EntryNotFoundError:
            if required:
                raise CheckpointError(f"{repo} has no file {name}") from None
            return None
        except LocalEntryNotFoundError:
            raise CheckpointError(f"cannot download {name} from {repo}: no connection (or "
                                  "HF_HUB_OFFLINE=1) and it is not in the local cache") from None

    config = fetch(CONFIG_FILE, required=False)
    mimi = fetch(MIMI_FILE, required=True)
    lm = fetch(LM_FILE, required=True) if with_lm else None
    return CheckpointFiles(repo, _config_from(config), mimi, lm,
                           fetch(TOKENIZER_FILE, required=False),
                           fetch(VOICES_FILE, required=False) if with_lm else None)


def resolve_checkpoint(spec: str, with_lm: bool = True) -> CheckpointFiles:
    """`spec` is a local directory or a hub repository id such as nvidia/personaplex-7b-v1."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return _local(path, with_lm)
    if path.exists():
        raise CheckpointError(f"{spec} is a file; give the checkpoint directory that holds it")
    if _REPO_ID.match(spec) and not spec.startswith((".", "/")):
        return _download(spec, with_lm)
    raise CheckpointError(f"checkpoint {spec} is neither a directory nor a hub repository id "
                          f"(like {DEFAULT_REPO})")
