"""Hugging Face Hub ids where the conversion commands take a checkpoint: `convert-hf
Qwen/Qwen3-0.6B[@REVISION]` and `convert-gguf REPO:FILE.gguf`, downloaded by `huggingface_hub`
into its cache (`HF_HOME`, `HF_HUB_CACHE`; `HF_HUB_OFFLINE=1` uses the cache alone; `HF_ENDPOINT`
names another Hub). A path that exists is always the local file or folder."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from rlx_mil.errors import HubError

#: `owner/name`, optionally `@revision` (a branch, tag or commit).
_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_])(?:@(?P<revision>[\w./-]+))?$")
#: What a checkpoint folder needs of a repository: config, weights, tokenizer, template, card.
CHECKPOINT_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja", "README.md"]


def hub_id(text: str | os.PathLike[str]) -> tuple[str, str | None] | None:
    """(repo id, revision) when `text` names a Hub repository rather than an existing path."""
    text = str(text)
    if os.path.exists(text) or text.startswith((".", "/", "~")):
        return None
    match = _REPO_ID.match(text)
    return (match["repo"], match["revision"]) if match else None


def hub_file(text: str | os.PathLike[str]) -> tuple[str, str, str | None] | None:
    """(repo id, file, revision) for `REPO:FILE` (`REPO@REV:FILE`) rather than an existing path."""
    text = str(text)
    if os.path.exists(text) or ":" not in text:
        return None
    repo_text, _, filename = text.partition(":")
    found = hub_id(repo_text)
    if found is None or not filename or filename.startswith("/"):
        return None
    return found[0], filename, found[1]


def _bars(quiet: bool) -> None:
    import huggingface_hub.utils as hub_utils

    if quiet or not sys.stderr.isatty():
        hub_utils.disable_progress_bars()
    else:
        hub_utils.enable_progress_bars()


def _typed(err: Exception, what: str) -> HubError:
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(err, GatedRepoError):
        return HubError(f"{what}: the repository is gated; accept its terms on the Hub and log in (`hf auth login`)")
    if isinstance(err, RepositoryNotFoundError):
        return HubError(f"{what}: no such repository on the Hub (or it is private: log in with `hf auth login`)")
    if isinstance(err, RevisionNotFoundError):
        return HubError(f"{what}: the repository has no such revision")
    if isinstance(err, LocalEntryNotFoundError):
        if constants.HF_HUB_OFFLINE:
            return HubError(f"{what}: not in the Hugging Face cache, and HF_HUB_OFFLINE is set; download it once"
                            " online, or pass a local folder")
        return HubError(f"{what}: cannot reach the Hugging Face Hub ({constants.ENDPOINT}) and the cache has no copy;"
                        " check the network, or pass a local folder")
    # (after LocalEntryNotFoundError, one of its kind)
    if isinstance(err, EntryNotFoundError):
        return HubError(f"{what}: the repository has no such file")
    return HubError(f"{what}: the download failed ({type(err).__name__}: {' '.join(str(err).split())[:300]})")


def download_checkpoint(repo: str, revision: str | None, quiet: bool = False) -> Path:
    """The cached snapshot folder of `repo` (config, safetensors, tokenizer files), downloaded
    where missing."""
    import huggingface_hub

    _bars(quiet)
    what = f"{repo}" + (f"@{revision}" if revision else "")
    try:
        folder = huggingface_hub.snapshot_download(repo, revision=revision, allow_patterns=CHECKPOINT_FILES)
    except Exception as err:  # every failure of the download is one typed error
        raise _typed(err, what) from None
    return Path(folder)


def download_file(repo: str, filename: str, revision: str | None, quiet: bool = False) -> Path:
    """The cached copy of one file of `repo` (a GGUF file), downloaded where missing."""
    import huggingface_hub

    _bars(quiet)
    what = f"{repo}:{filename}"
    try:
        return Path(huggingface_hub.hf_hub_download(repo, filename, revision=revision))
    except Exception as err:
        raise _typed(err, what) from None


def resolve_checkpoint(args: Any, attribute: str) -> None:
    """Replace `args.<attribute>` (a checkpoint folder or a Hub id, as typed) by a local folder."""
    given = getattr(args, attribute)
    found = hub_id(given)
    if found is None:
        setattr(args, attribute, Path(given))
    else:
        setattr(args, attribute, download_checkpoint(*found, quiet=getattr(args, "quiet", False)))


def resolve_gguf(args: Any, attribute: str) -> None:
    """Replace `args.<attribute>` (a GGUF file or `REPO:FILE`) by a local file."""
    found = hub_file(getattr(args, attribute))
    if found is not None:
        repo, filename, revision = found
        setattr(args, attribute, download_file(repo, filename, revision, quiet=getattr(args, "quiet", False)))
