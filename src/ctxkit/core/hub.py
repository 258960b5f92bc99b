"""Checkpoints from the Hugging Face Hub, through ``huggingface_hub`` and its cache.

:func:`hub_snapshot` gives the local folder of a Hub model repository:

* the cache is shared with transformers (``HF_HOME`` / ``HF_HUB_CACHE``), so a model that
  transformers (or ``hf download``) already fetched loads with no network;
* only what ctxkit reads is fetched: ``config.json``, the vocabulary / merges / tokenizer
  files, and the weights as safetensors, or as PyTorch pickles (read with
  ``weights_only=True``) when a repository has no safetensors;
* a pinned revision (a commit hash) is used when cached; otherwise a cached copy of the
  repository's default branch is accepted (said in the log) before anything is downloaded;
* downloads show progress bars; a dropped connection is resumed within the call
  (``huggingface_hub`` asks for the rest with an HTTP ``Range``, from the last whole
  10 MiB chunk it received); a failed call leaves the files already complete in the cache,
  so running it again fetches only the others (a file cut off part-way starts over:
  ``huggingface_hub`` 2.x deletes partial downloads rather than keeping them between calls);
* every file downloaded is hashed and compared with the Hub's record of it, which names its
  blob in the cache: the SHA-256 of an LFS file (weights), the git blob id of any other
  (config, vocabulary, tokenizer files); a mismatch removes the file from the cache and fails;
* ``HF_HUB_OFFLINE=1``: the cache only; a repository not in it is one clear error naming the
  id, the cache folder and how to get the files.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import socket
import threading
import urllib.parse
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

# The rest of huggingface_hub (its HTTP client stack: ~1 s of imports) is imported by the
# functions that talk to the Hub: every `ctxkit` command imports this module, few download.
from huggingface_hub import constants as hf_constants
from tqdm.auto import tqdm

from .diskspace import DiskFullError, free_bytes, is_out_of_space
from .errors import UserError

__all__ = ["HubDownloadError", "HubNotCachedError", "CONFIG_AND_VOCAB", "hub_cache_dir", "hub_snapshot", "is_hub_id",
           "hub_unreachable", "is_offline", "cached_snapshot", "push_folder"]

logger = logging.getLogger("ctxkit")

# What ctxkit reads from a model repository besides the weights.
CONFIG_AND_VOCAB = (
    "config.json",
    "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",  # WordPiece (BERT, DistilBERT)
    "vocab.json", "merges.txt",  # byte-level BPE (GPT-2)
    "task.json", "head.safetensors", "fast.json",  # a fine-tuned run pushed by `ctxkit push` (tasks.runs.push_run)
)
SAFETENSORS = ("model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json")
PICKLES = ("pytorch_model.bin", "pytorch_model-*-of-*.bin", "pytorch_model.bin.index.json")
_WEIGHT_FILE = re.compile(r"^(model(-\d+-of-\d+)?\.safetensors|pytorch_model(-\d+-of-\d+)?\.bin)$")
_SHA256_NAME = re.compile(r"^[0-9a-f]{64}$")
_GIT_BLOB_NAME = re.compile(r"^[0-9a-f]{40}$")
# A Hub repository id: "name" (legacy top-level models such as gpt2) or "org/name".
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")


class HubNotCachedError(UserError):
    """The repository is not in the local cache and the Hub cannot be asked (offline)."""


class HubDownloadError(UserError):
    """The Hub refused or failed the download (unknown repository, gated, interrupted, corrupted)."""


#: the Hub's longest repository id (huggingface_hub's validate_repo_id)
MAX_HUB_ID = 96


def is_hub_id(name: str) -> bool:
    """Whether ``name`` can be a Hub repository id (``gpt2``, ``google-bert/bert-base-cased``)."""
    return (len(name) <= MAX_HUB_ID and bool(_HUB_ID.match(name)) and ".." not in name
            and not name.endswith((".", "-")))


def is_offline() -> bool:
    """``HF_HUB_OFFLINE`` (read now, so tests and users can set it after import)."""
    value = os.environ.get("HF_HUB_OFFLINE", "")
    return value.upper() in ("1", "ON", "YES", "TRUE") or bool(getattr(hf_constants, "HF_HUB_OFFLINE", False))


def hub_cache_dir() -> Path:
    """The Hub cache transformers uses too: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub`` (read now, not at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path(hf_constants.HF_HUB_CACHE)


def _has_weights(folder: Path) -> bool:
    return any(_WEIGHT_FILE.match(p.name) for p in folder.iterdir())


def _snapshot(repo_id: str, revision: Optional[str], patterns: Sequence[str], local_only: bool, progress: bool) -> Path:
    kwargs = dict(revision=revision, allow_patterns=list(patterns), local_files_only=local_only, cache_dir=hub_cache_dir())
    if not progress:
        kwargs["tqdm_class"] = _Silent
    from huggingface_hub import snapshot_download  # lazy: the HTTP stack, only when the Hub is asked

    return Path(snapshot_download(repo_id, **kwargs))


def cached_snapshot(repo_id: str, revision: Optional[str] = None) -> Optional[Path]:
    """The cached folder of ``repo_id`` (at ``revision``, else at any cached revision of the
    default branch) holding a config and weights, or None. Never touches the network."""
    # One weight format at a time, as hub_snapshot downloads them: huggingface_hub checks a cached
    # snapshot against the file listing it cached, and a repository with both formats never has
    # its pickles fetched, so asking for both would call every such snapshot incomplete.
    from huggingface_hub.errors import (EntryNotFoundError, LocalEntryNotFoundError, OfflineModeIsEnabled,  # lazy: as above
                                        RevisionNotFoundError)

    for rev in ([revision] if revision else []) + [None]:
        for weights in (SAFETENSORS, PICKLES):
            try:
                folder = _snapshot(repo_id, rev, CONFIG_AND_VOCAB + weights, local_only=True, progress=False)
            except (LocalEntryNotFoundError, OfflineModeIsEnabled, EntryNotFoundError, RevisionNotFoundError,
                    ValueError):
                continue
            if (folder / "config.json").is_file() and _has_weights(folder):
                if revision and rev is None and folder.name != revision:
                    logger.info("%s: using the cached revision %s (the pinned %s is not cached)", repo_id, folder.name,
                                revision)
                return folder
    return None


def hub_snapshot(repo_id: str, revision: Optional[str] = None, progress: bool = True) -> Path:
    """The local folder of a Hub model repository, downloading what ctxkit needs if required.

    Args:
        repo_id: ``org/name`` or a legacy top-level id (``gpt2``).
        revision: a commit hash (pinned), branch or tag; None: the default branch.
        progress: show download progress bars.

    Returns:
        The snapshot folder in the Hub cache (config, vocabulary files and weights).

    Raises:
        HubNotCachedError: offline and not cached (the message says how to get it).
        HubDownloadError: unknown or gated repository, unknown revision, a failed or
            interrupted download (run again to resume), or a file whose SHA-256 does not
            match the Hub's record (the file is removed from the cache).
    """
    folder = cached_snapshot(repo_id, revision)
    if folder is not None:
        return folder
    where = f"at revision {revision} " if revision else ""
    advice = (f"download it where the Hub is reachable (ctxkit download {repo_id}, or hf download {repo_id}), "
              "copy the cache folder here (HF_HOME), or pass the path of a local model folder")
    if is_offline():
        raise HubNotCachedError(f"{repo_id} {where}is not in the Hugging Face cache ({hub_cache_dir()}) and HF_HUB_OFFLINE is set: "
                                + advice)
    why = hub_unreachable()
    if why is not None:  # no network: say so at once, instead of huggingface_hub's minute of retries
        raise HubNotCachedError(f"{repo_id} {where}is not in the Hugging Face cache ({hub_cache_dir()}) and the Hub cannot be "
                                f"reached ({why}): {advice}; HF_HUB_OFFLINE=1 says so without trying")
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError  # lazy: as above

    try:
        folder = _snapshot(repo_id, revision, CONFIG_AND_VOCAB + SAFETENSORS, local_only=False, progress=progress)
        if not _has_weights(folder):  # an older repository: PyTorch pickles only (read with weights_only=True)
            folder = _snapshot(repo_id, revision, CONFIG_AND_VOCAB + PICKLES, local_only=False, progress=progress)
    except GatedRepoError:
        raise HubDownloadError(f"{repo_id} is gated on the Hub: accept its terms on huggingface.co and log in "
                               "(hf auth login), then run again") from None
    except RepositoryNotFoundError:
        raise HubDownloadError(f"{repo_id}: no such model repository on the Hub ({_endpoint()})") from None
    except RevisionNotFoundError:
        raise HubDownloadError(f"{repo_id} has no revision {revision!r} on the Hub") from None
    except UserError:
        raise
    except Exception as err:  # connection reset, timeout, HTTP errors: each huggingface_hub version has its own types
        if is_out_of_space(err):
            raise DiskFullError(hub_cache_dir(), free=free_bytes(hub_cache_dir()), intact="the files already complete are kept: "
                                "free some space and run the same command again to resume") from err
        raise HubDownloadError(f"downloading {repo_id} failed ({type(err).__name__}: {str(err)[:300]}); run the same "
                               "command again to resume (the files already complete are kept; a file cut off part-way "
                               "starts over), or set HF_HUB_OFFLINE=1 to use only the cache") from None
    if not (folder / "config.json").is_file() or not _has_weights(folder):
        raise HubDownloadError(f"{repo_id} has no config.json with safetensors or pytorch_model.bin weights: "
                               "not a model ctxkit can load")
    verify_snapshot(folder)
    return folder


def _blob_digest(blob: Path) -> Optional[Tuple[str, str]]:
    """``(kind, digest)`` of a cache blob, computed the way its name records it: ``sha256``
    for an LFS file, ``git blob id`` (SHA-1 of ``"blob SIZE\\0"`` and the bytes) for any
    other; None when the name records neither."""
    if _SHA256_NAME.match(blob.name):
        kind, digest = "sha256", hashlib.sha256()
    elif _GIT_BLOB_NAME.match(blob.name):
        kind, digest = "git blob id", hashlib.sha1(b"blob %d\0" % blob.stat().st_size)
    else:
        return None
    with open(blob, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return kind, digest.hexdigest()


def verify_snapshot(folder: Path) -> List[str]:
    """Hash every file of a snapshot and compare with the Hub's record that names its cache
    blob: the SHA-256 of an LFS file (weights), the git blob id of the others (config,
    vocabulary, tokenizer files). A mismatch removes the file and its blob from the cache, so
    the next call downloads it again, and raises.

    Returns:
        The names of the files checked.
    """
    checked, bad = [], []
    for path in sorted(folder.iterdir()):
        if not path.is_symlink():
            continue  # a copied (not linked) cache carries no digest to compare with
        blob = path.resolve()
        found = _blob_digest(blob) if blob.is_file() else None
        if found is None:
            continue
        kind, digest = found
        checked.append(path.name)
        if digest != blob.name:
            bad.append(f"{path.name}: {kind} {digest}, the Hub records {blob.name}")
            blob.unlink(missing_ok=True)
            path.unlink(missing_ok=True)
    if bad:
        raise HubDownloadError(f"{folder}: downloaded files do not match their checksums (removed from the cache; "
                               "run again to download them afresh): " + "; ".join(bad))
    return checked


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


PROBE_SECONDS = 2.0


def hub_unreachable() -> Optional[str]:
    """Why the Hub's host cannot be reached from here (None when a TCP connection opens),
    asked once per endpoint and process within :data:`PROBE_SECONDS`. Behind a proxy
    (``HTTPS_PROXY``, ...) nothing is probed: the proxy decides."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")):
        return None
    return _probe(_endpoint())


@functools.lru_cache(maxsize=8)
def _probe(endpoint: str) -> Optional[str]:
    url = urllib.parse.urlsplit(endpoint)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    answer: List[Optional[str]] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
            answer.append(None)
        except OSError as err:
            answer.append(f"{host}:{port}: {err.strerror or err}")

    # A thread: the name lookup itself takes no timeout and can hang without a network.
    probe = threading.Thread(target=connect, daemon=True)
    probe.start()
    probe.join(PROBE_SECONDS)
    return answer[0] if answer else f"{host}:{port}: no answer within {PROBE_SECONDS:g} s"


class _Silent(tqdm):
    """A tqdm that draws nothing (``progress=False``)."""

    def __init__(self, *args, **kwargs):
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def push_folder(folder: Path, repo_id: str, *, private: Optional[bool] = None, commit_message: Optional[str] = None,
                revision: Optional[str] = None, token: Optional[str] = None) -> str:
    """Upload every file of ``folder`` to the Hub repository ``repo_id`` (created if missing,
    ``private`` as asked) in one commit, through ``huggingface_hub``'s upload API; returns the
    commit's URL.

    Raises:
        UserError: not a Hub id, offline, or the Hub refused (no token, no write access...).
    """
    if not is_hub_id(repo_id):
        raise UserError(f"{repo_id!r} is not a Hub repository id (org/name)")
    if is_offline():
        raise UserError(f"cannot push to {repo_id}: HF_HUB_OFFLINE is set")
    from huggingface_hub import HfApi  # lazy: as above
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, revision=revision,
                                 commit_message=commit_message or "Upload with ctxkit")
    except HfHubHTTPError as err:
        raise UserError(f"the Hub refused the push to {repo_id}: {err}") from None
    return str(info.commit_url if hasattr(info, "commit_url") else info)
