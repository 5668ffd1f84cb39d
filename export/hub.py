"""Finding a checkpoint's files: a local directory or a Hugging Face repository.

Both give the same `CheckpointFiles`; a repository is fetched through huggingface_hub (its cache,
progress bars, HF_TOKEN and offline mode apply), file by file, only the files that are needed.
Before a download the hub's metadata gives each file's size (a missing file or a full disk is
an error before anything is fetched); after it, and for local directories, every file is checked
against those sizes and safetensors files against their own headers, so a truncated file is a
clear CheckpointError, not a crash an hour into an export.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

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
    revision: str | None = None  # the hub commit the files are from (None: a local directory)


def _config_from(path: Path | None) -> PersonaPlexConfig:
    """The checkpoint's config.json (the defaults, PersonaPlex-7B, where there is none)."""
    return PersonaPlexConfig() if path is None else PersonaPlexConfig.from_json_file(path)


def mimi_file(cfg: PersonaPlexConfig) -> str:
    """The Mimi weights' file in a checkpoint: the config's mimi_name (the seed's field), or the
    name PersonaPlex and Moshi publish it under. Only a file name: it never leaves the
    checkpoint directory or repository."""
    name = cfg.mimi_config.mimi_name or MIMI_FILE
    if Path(name).name != name or name in (".", ".."):
        raise CheckpointError(f"mimi_name {name!r} must be a file name inside the checkpoint")
    return name


def _spm_check(path: Path) -> None:
    try:
        import sentencepiece as spm

        spm.SentencePieceProcessor(model_file=str(path))
    except ImportError:
        return  # the export extra brings it; nothing to check with otherwise
    except Exception as e:  # sentencepiece raises RuntimeError/OSError for a damaged model
        raise CheckpointError(f"{path} is not a readable SentencePiece model ({e}); download "
                              "it again") from None


def check_checkpoint_files(ckpt: CheckpointFiles,
                           expected_sizes: dict[str, int] | None = None) -> None:
    """Catches damaged or incomplete files before a long export starts: a safetensors file
    shorter than its header declares (an interrupted download), any file whose size differs
    from what the hub reports (`expected_sizes`: file name -> bytes), an unreadable tokenizer.
    Reads headers only."""
    from .safetensors_file import SafetensorsHeader

    sizes = expected_sizes or {}
    for path in (ckpt.mimi, ckpt.lm, ckpt.tokenizer, ckpt.voices):
        if path is None:
            continue
        want = sizes.get(path.name)
        if path.suffix == ".safetensors":
            SafetensorsHeader(path).check_complete(want)
        size = path.stat().st_size
        if want is not None and size != want:
            raise CheckpointError(
                f"{path} has {size:,} bytes, the hub says {want:,}: the download is incomplete "
                "or damaged; delete the file and download it again")
        if size == 0:
            raise CheckpointError(f"{path} is empty; download it again")
    if ckpt.tokenizer is not None:
        _spm_check(ckpt.tokenizer)


def _local(root: Path, with_lm: bool) -> CheckpointFiles:
    def opt(name: str) -> Path | None:
        return root / name if (root / name).is_file() else None

    config = _config_from(opt(CONFIG_FILE))
    mimi_name = mimi_file(config)
    mimi = opt(mimi_name)
    if mimi is None:
        raise CheckpointError(f"{root} has no {mimi_name}: a PersonaPlex checkpoint directory "
                              f"holds {mimi_name}, {LM_FILE}, {TOKENIZER_FILE} and {CONFIG_FILE}")
    lm = opt(LM_FILE) if with_lm else None
    if with_lm and lm is None:
        raise CheckpointError(f"{root} has no {LM_FILE} (to export only the codec, use "
                              "--codec-only)")
    ckpt = CheckpointFiles(str(root), config, mimi, lm,
                           opt(TOKENIZER_FILE) if with_lm else None,
                           opt(VOICES_FILE) if with_lm else None)
    check_checkpoint_files(ckpt)
    return ckpt


def _gated(repo: str) -> CheckpointError:
    return CheckpointError(
        f"{repo} is gated: accept its licence on https://huggingface.co/{repo} (logged in), "
        "then log in here ('hf auth login') or set HF_TOKEN to a token of that account")


def _not_found(repo: str) -> CheckpointError:
    return CheckpointError(f"{repo} was not found on the Hugging Face hub (or it is private and "
                           "no token was given; set HF_TOKEN)")


def remote_sizes(repo: str, names: list[str]) -> dict[str, int] | None:
    """{file name: bytes} of those of `names` the repository has, from the hub's metadata
    (no download); None when the hub cannot be asked (offline, no connection)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        entries = HfApi().get_paths_info(repo, names)
    except GatedRepoError:
        raise _gated(repo) from None
    except RepositoryNotFoundError:
        raise _not_found(repo) from None
    except Exception:  # offline mode, no network, a proxy error: the downloads will say more
        return None
    return {e.path: int(e.size) for e in entries if getattr(e, "size", None) is not None}


def _cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _check_disk_space(repo: str, missing: dict[str, int]) -> None:
    """Refuses to start a download that cannot fit in the hub cache."""
    need = sum(missing.values())
    where = _cache_dir()
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need > free:
        raise CheckpointError(
            f"downloading {', '.join(missing)} from {repo} needs {need / 1e9:.1f} GB in {where}, "
            f"which has {free / 1e9:.1f} GB free: free some space, or point HF_HUB_CACHE (or "
            "HF_HOME) at a larger disk")


def hub_fetch(repo: str, name: str, required: bool, sizes: dict[str, int] | None,
              progress: Callable[[str], None]) -> Path | None:
    """One file of a hub repository through huggingface_hub's cache; None for an optional one
    the repository lacks (or, offline, the cache). Every failure a CheckpointError."""
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError,
                                            LocalEntryNotFoundError, RepositoryNotFoundError)
    except ImportError as e:
        raise CheckpointError("downloading needs huggingface_hub: pip install "
                              "'personaplex-edge[export]'") from e
    if sizes is not None and name not in sizes and not required:
        return None  # the hub said the repository does not have it
    try:
        return Path(hf_hub_download(repo, name))
    except GatedRepoError:
        raise _gated(repo) from None
    except RepositoryNotFoundError:
        raise _not_found(repo) from None
    except LocalEntryNotFoundError:  # (a subclass of EntryNotFoundError: first)
        if not required:
            progress(f"{name}: not in the local cache and the hub cannot be reached; "
                     "going on without it")
            return None
        raise CheckpointError(f"cannot download {name} from {repo}: no connection (or "
                              "HF_HUB_OFFLINE=1) and it is not in the local cache") from None
    except EntryNotFoundError:
        if required:
            raise CheckpointError(f"{repo} has no file {name}") from None
        return None
    except Exception as e:  # network and HTTP errors: one line, not a traceback
        raise CheckpointError(f"cannot download {name} from {repo}: {e}") from e


def prepare_download(repo: str, sizes: dict[str, int] | None, required: list[str],
                     progress: Callable[[str], None], what: str) -> None:
    """Before fetching: every required file there (`what` says what the repository should
    be), the missing ones' bytes free in the cache, a line for each large one."""
    from huggingface_hub import try_to_load_from_cache

    if sizes is None:
        return
    absent = [name for name in required if name not in sizes]
    if absent:
        raise CheckpointError(f"{repo} has no file {', '.join(absent)}: is it {what}?")
    missing = {name: size for name, size in sizes.items()
               if not isinstance(try_to_load_from_cache(repo, name), str)}
    _check_disk_space(repo, missing)
    for name, size in missing.items():
        if size > 100 << 20:
            progress(f"downloading {name} ({size / 1e9:.1f} GB) from {repo}")


def _download(repo: str, with_lm: bool, progress: Callable[[str], None]) -> CheckpointFiles:
    def fetch(name: str, required: bool, sizes: dict[str, int] | None) -> Path | None:
        return hub_fetch(repo, name, required, sizes, progress)

    # the config first (a few bytes): it may name the Mimi file
    config_path = fetch(CONFIG_FILE, required=False, sizes=None)
    config = _config_from(config_path)
    mimi_name = mimi_file(config)
    required = [mimi_name] + ([LM_FILE] if with_lm else [])
    optional = [TOKENIZER_FILE, VOICES_FILE] if with_lm else []
    sizes = remote_sizes(repo, required + optional + ([CONFIG_FILE] if config_path else []))
    prepare_download(repo, sizes, required, progress,
                     f"a PersonaPlex checkpoint (like {DEFAULT_REPO})")

    mimi = fetch(mimi_name, True, sizes)
    lm = fetch(LM_FILE, True, sizes) if with_lm else None
    ckpt = CheckpointFiles(repo, config, mimi, lm,
                           fetch(TOKENIZER_FILE, False, sizes) if with_lm else None,
                           fetch(VOICES_FILE, False, sizes) if with_lm else None,
                           revision=mimi.parent.name)  # .../snapshots/<commit>/<file>
    check_checkpoint_files(ckpt, sizes)
    return ckpt


def resolve_checkpoint(spec: str, with_lm: bool = True,
                       progress: Callable[[str], None] = print) -> CheckpointFiles:
    """`spec` is a local directory or a hub repository id such as nvidia/personaplex-7b-v1.
    Either way the files are checked (sizes, headers) before anything long starts."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return _local(path, with_lm)
    if path.exists():
        raise CheckpointError(f"{spec} is a file; give the checkpoint directory that holds it")
    if _REPO_ID.match(spec) and not spec.startswith((".", "/")):
        return _download(spec, with_lm, progress)
    raise CheckpointError(f"checkpoint {spec} is neither a directory nor a hub repository id "
                          f"(like {DEFAULT_REPO})")
